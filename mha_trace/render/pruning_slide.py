"""The pruning curve's slide (`ablate --prune --png`): the whole curve beside the part the
exercise asks about."""

from mha_trace.analyses.pruning import RISES, Pruning
from mha_trace.io.page import slide
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, TICK_PAD, WIDTH_PX, _fitted,
                                    _pyplot, _rc, _save, _theme, framed, heading, text_px)


@slide.register(Pruning)
def pruning_slide(p: Pruning, path: str, theme: str = "light", **_) -> None:
    save_curve(path, f"{p.model.name}: the next-token loss as heads are removed", p.points,
               len(p.order), p.base, RISES, theme)


def save_curve(path: str, title: str, points: list, total: int, base: float, rises: tuple,
               theme: str = "light") -> None:
    """The pruning curve on one slide: on the left the whole curve, on the right (the larger) the
    part the exercise asks about, up to a 25% rise, with the loss of the whole model, the 5% and
    10% rises, and how many heads go before each."""
    plt = _pyplot()

    fg, bg = _theme(theme)
    xs, ys = [k for k, _ in points], [loss for _, loss in points]
    over = next((k for k, loss in points if loss > base * 1.25), total)
    labels = [_rise_label(points, base, rise) for rise in (0, *rises)]
    values = text_px([f"{base * 1.27:.2f}"], MIN_TICK_PT)[0] + TICK_PAD  # the losses' labels
    with plt.rc_context(_rc(fg)):
        fig, (whole, near) = plt.subplots(1, 2, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI,
                                          facecolor=bg, gridspec_kw=framed(
                                              16 + text_px([], 22)[1] + values,
                                              16 + text_px(labels, 18)[0], heading(28, title=22),
                                              16 + text_px([], 20)[1] + text_px([], MIN_TICK_PT)[1]
                                              + TICK_PAD, cols=2, gap=values + 24,
                                              width_ratios=[2, 3]))
        for ax in (whole, near):
            ax.set_facecolor(bg)
            ax.plot(xs, ys, "o-", color="#3b528b", linewidth=3, markersize=10)
            for rise, style in zip((0, *rises), ("-", "--", ":")):
                ax.axhline(base * (1 + rise), color="#5ec962" if rise else "#888888",
                           linestyle=style, linewidth=2)
            ax.set_xlabel(f"heads removed, least important first (of {total})", fontsize=20)
            ax.tick_params(labelsize=MIN_TICK_PT)
            ax.grid(alpha=0.3)
        whole.set_xlim(0, total)
        whole.set_ylabel("next-token loss (nats)", fontsize=22)
        whole.set_title("every head removed in turn", fontsize=22, color=fg)
        near.set_xlim(0, over)
        near.set_ylim(base * 0.97, base * 1.27)
        near.set_title("up to a 25% rise: where the exercise is", fontsize=22, color=fg)
        for rise, label in zip((0, *rises), labels):
            near.text(over, base * (1 + rise), label, va="center", fontsize=18, color=fg)
        fig.suptitle(_fitted(title, 95, 28), fontsize=28, color=fg)
    _save(plt, fig, path, bg)


def _rise_label(points: list, base: float, rise: float) -> str:
    """" +10%: 30 heads go first": the last count under the rise before the first over it."""
    kept = [k for k, loss in points if loss <= base * (1 + rise)]
    last = next((k for k, loss in points if loss > base * (1 + rise)), None)
    gone = max((k for k in kept if last is None or k < last), default=0)
    return " every head" if rise == 0 else f" +{rise:.0%}: {gone} heads go first"
