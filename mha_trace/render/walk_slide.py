"""The explain walk's slide (`explain --png`): a row per head, its scores, its weights (beside
their effect with --effect) and its output."""

from dataclasses import replace

from mha_trace.analyses.walk import Walk
from mha_trace.io.page import slide
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, SLIDE_W, WIDTH_PX, _fitted,
                                    _pyplot, _rc, _save, _theme, _ticks, _values_on,
                                    _weights_on, bars, few_ticks, rows_layout,
                                    token_label)


@slide.register(Walk)
def walk_slide(w: Walk, path: str, theme: str = "light", head: int | None = None, **_) -> None:
    """The walk's slide (--why: its split's): the head asked for, else every head of the layer,
    each named as the terminal names it (3.1 in a model's layer 3)."""
    from mha_trace.render.why_slide import save_why

    if head is not None:
        w = replace(w, heads=[hw for hw in w.heads if hw.head == head],
                    why=w.why and [y for y in w.why if y.head == head])
    (save_why if w.why else save_walk)(path, w.view.through(w.token, head), w, theme)


def save_walk(path: str, title: str, walk, theme: str = "light") -> None:
    """The explain walk on one slide: for the chosen query, a row per head with its q·k beside
    q·k / √d_k for every key, the softmax weights (beside their effect with --effect), and the
    head's output Σ w·v (d_k numbers)."""
    plt = _pyplot()
    import numpy as np

    fg, bg = _theme(theme)
    heads, keys = walk.heads, [token_label(t.token) for t in walk.heads[0].terms]
    effect = heads[0].terms[0].effect is not None
    xs, size = _ticks(len(keys), SLIDE_W / 3 * 0.8)
    small = {"xtick.labelsize": MIN_TICK_PT, "ytick.labelsize": MIN_TICK_PT, "axes.facecolor": bg}
    with plt.rc_context({**_rc(fg), **small}):  # set once: tick_params on each of 36 axes took 0.1 s
        fig, axes = plt.subplots(len(heads), 3, squeeze=False,
                                 figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI,
                                 facecolor=bg, gridspec_kw=rows_layout(
                                     [f"head {walk.view.head_name(hw.head)}" for hw in heads],
                                     [keys[j] for j in xs], size))
        for row, hw in zip(axes, heads):
            _walk_row(plt, row, hw, walk.sqrt_dk, len(heads), fg, bg, walk.view.head_name)
        for ax, name in zip(axes[0], ("scores for every key", "softmax: weights and effect"
                                      if effect else "softmax: the weights",
                                      "Σ w·v: this head's output")):
            ax.set_title(name, fontsize=22, color=fg)
        handles = [h for ax in axes[0][:2] for h in zip(*ax.get_legend_handles_labels())]
        fig.legend(*zip(*handles), loc="lower left", bbox_to_anchor=(0.005, 0.0),
                   ncols=len(handles), fontsize=16, facecolor=bg, labelcolor=fg, frameon=False)
        for ax in axes[-1][:2]:
            ax.set_xticks(xs, [keys[j] for j in xs], rotation=90, fontsize=size)
        dims = np.arange(len(heads[0].output))
        axes[-1][2].set_xticks(dims[::max(1, len(dims) // 16)])
        for row in axes[:-1]:  # one key axis a column, at the bottom: the rows above draw none
            for ax, bottom in zip(row, axes[-1]):
                ax.set_xlim(bottom.get_xlim())
                ax.set_xticks([])
        axes[-1][2].set_xlabel("dimension of the head", fontsize=18)
        fig.suptitle(_fitted(title, 95, 28), fontsize=28, color=fg)
    _save(plt, fig, path, bg)


def _latent_bars(ax, x, hw, scaled, sqrt_dk: float) -> None:
    """An MLA head's scores: each key's content part and RoPE part beside their sum scaled."""
    import numpy as np

    content, position = (np.array([0.0 if t.masked else t.parts[i] for t in hw.terms]) for i in (0, 1))
    bars(ax, x - 0.27, content, 0.27, color="#3b528b", label="q_C·k_C: the latent's part")
    bars(ax, x, position, 0.27, color="#21918c", label="q_R·k_R: the RoPE part")
    bars(ax, x + 0.27, scaled, 0.27, color="#5ec962", label=f"their sum ÷ √(d_h + d_R) (÷ {sqrt_dk:.2f})")


def _walk_row(plt, row, hw, sqrt_dk: float, shown: int, fg: str, bg: str, name=str) -> None:
    """One head of the walk's slide (of `shown`): its scores, its weights (and effect), its
    output; with few heads and keys, the numbers too."""
    import numpy as np

    few = shown <= 4
    x = np.arange(len(hw.terms))
    effect = hw.terms[0].effect is not None
    masked = np.array([t.masked for t in hw.terms])
    dots = np.array([0.0 if t.masked else t.dot for t in hw.terms])
    scaled = np.array([0.0 if t.masked else t.scaled for t in hw.terms])
    weights = np.array([t.weight for t in hw.terms])
    if hw.terms[0].parts is not None:  # MLA: the score's two parts, then their sum scaled
        _latent_bars(row[0], x, hw, scaled, sqrt_dk)
    else:
        bars(row[0], x - 0.2, dots, 0.4, color="#3b528b", label="q·k")
        bars(row[0], x + 0.2, scaled, 0.4, color="#5ec962", label=f"q·k ÷ √d_k (÷ {sqrt_dk:.2f})")
    if effect:  # the weights beside the effect weights (--effect)
        bars(row[1], x - 0.2, weights, 0.4, color="#9b5fc0", label="weight")
        bars(row[1], x + 0.2, [t.effect for t in hw.terms], 0.4, color="#f58231",
             label="effect: weight × ‖v·W_O‖, renormalised")
    else:
        bars(row[1], x, weights, 0.7, color=plt.get_cmap("viridis")(weights / max(weights.max(), 1e-9)))
    bars(row[1], x[masked], np.full(masked.sum(), 0.02), 0.7, hatch="///")
    bars(row[2], np.arange(len(hw.output)), hw.output, 0.7)
    if len(x) <= 8 and few and hw.terms[0].parts is None:  # room for the numbers (a 0 once for its two bars)
        same = dots == scaled
        _values_on(row[0], np.concatenate([np.where(same, x, x - 0.2), (x + 0.2)[~same]]),
                   np.concatenate([dots, scaled[~same]]), fg, 13)
        if not effect:
            _values_on(row[1], x, weights, fg, 16)
    if effect and shown <= 2 and len(x) <= 20:  # each weight and effect that counts, upright
        _weights_on(row[1], np.concatenate([x - 0.2, x + 0.2]),
                    np.concatenate([weights, [t.effect for t in hw.terms]]), fg, 12, rotation=90)
    if len(hw.output) <= 8 and few:
        _values_on(row[2], np.arange(len(hw.output)), hw.output, fg, 16)
    row[0].set_ylabel(f"head {name(hw.head)}", fontsize=18, rotation=0, ha="right", va="center")
    for ax in row:
        ax.axhline(0, color=fg, linewidth=0.8)
        few_ticks(ax)
