"""The KV-cache lab's slide (`cache --png`): perplexity against the cache's budget, a line per
policy, the full cache as the line they approach."""

from mha_trace.analyses.kvcache import CacheLab
from mha_trace.io.page import slide
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, TICK_PAD, WIDTH_PX, _fitted,
                                    _pyplot, _rc, _save, _theme, framed, heading, text_px)

COLOURS = {"window": "#d1495b", "sinks": "#00798c", "h2o": "#edae49"}


@slide.register(CacheLab)
def cache_slide(lab: CacheLab, path: str, theme: str = "light", **_) -> None:
    plt = _pyplot()

    fg, bg = _theme(theme)
    full = lab.full.perplexity
    values = [f"{x:.0f}" for x in (full, *(r.perplexity for r in lab.results))]  # the y labels' width
    name = text_px([], 22)[1]
    with plt.rc_context(_rc(fg)):
        fig, ax = plt.subplots(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, facecolor=bg,
                               gridspec_kw=framed(16 + name + text_px(values, MIN_TICK_PT + 5)[0] + TICK_PAD,
                                                  64, heading(28), 16 + name + TICK_PAD
                                                  + text_px([], MIN_TICK_PT + 5)[1]))
        ax.set_facecolor(bg)
        drawn = []  # (budget, perplexity, colour) of every point
        for renumber, style in ((False, "o-"), (True, "s--")):
            for policy, colour in COLOURS.items():
                points = sorted((r.setting.budget, r.perplexity) for r in lab.results
                                if r.setting.policy == policy and r.setting.renumber == renumber)
                if points:
                    label = policy + (" (renumbered)" if renumber else "")
                    ax.plot(*zip(*points), style, color=colour, linewidth=4, markersize=14,
                            label=label)
                    drawn += [(budget, value, colour) for budget, value in points]
        for i, (budget, value, colour) in enumerate(drawn):  # each point's perplexity, written in
            under = any(b == budget and (v, -j) > (value, -i) and v < value * 1.1
                        for j, (b, v, _) in enumerate(drawn) if j != i)  # a close one above it
            ax.annotate(f"{value:.1f}", (budget, value), textcoords="offset points",
                        xytext=(10, -26 if under else 8), fontsize=16, color=colour)
        ax.axhline(full, color="#888888", linewidth=3,
                   label=f"full ({len(lab.ids)} tokens): {full:.1f}")
        ax.annotate(f"{full:.1f}", (0, full), xycoords=("axes fraction", "data"),
                    textcoords="offset points", xytext=(8, -22), fontsize=18, color="#888888")
        budgets = sorted({r.setting.budget for r in lab.results if r.setting.budget})
        ax.set_xscale("log", base=2)
        ax.set_xticks(budgets, [str(b) for b in budgets])
        ax.set_xlabel("cache budget B (tokens kept, the one being read included)", fontsize=22)
        ax.set_yscale("log")  # equal steps are equal losses in nats: the small gaps stay visible
        from matplotlib.ticker import ScalarFormatter

        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.set_ylabel("perplexity over the text (log scale)", fontsize=22)
        ax.tick_params(labelsize=MIN_TICK_PT + 5)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=20, facecolor=bg, labelcolor=fg)
        fig.suptitle(_fitted(f"{lab.model.name}: what a smaller KV cache costs "
                             f"({lab.text_name})", 95, 28), fontsize=28, color=fg)
    _save(plt, fig, path, bg)
