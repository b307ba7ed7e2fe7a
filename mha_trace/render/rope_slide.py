"""The RoPE planes' slide (`explain --rope-planes --png`): for each head, every plane's part of
each key's score as a map (planes down, keys across, red up and blue down), and beside it how
the head's |parts| divide between the planes, fastest at the top."""

import numpy as np

from mha_trace.analyses.rope_planes import RopePlanes, shown_keys
from mha_trace.io.page import slide
from mha_trace.io.units import turn_text
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, WIDTH_PX, _fitted, _pyplot, _rc,
                                    _save, _theme, slide_heads, text_px, token_label)


@slide.register(RopePlanes)
def rope_slide(t: RopePlanes, path: str, theme: str = "light", head: int | None = None, **_) -> None:
    only = head or t.walk.only
    heads = slide_heads(t.walk, t.heads, only)
    w = t.walk
    plt = _pyplot()
    from matplotlib.ticker import PercentFormatter

    fg, bg = _theme(theme)
    small = {"xtick.labelsize": MIN_TICK_PT, "ytick.labelsize": MIN_TICK_PT, "axes.facecolor": bg}
    planes = len(t.frequencies)
    every = max(1, planes // 8)  # plane labels: at most 8 a column
    with plt.rc_context({**_rc(fg), **small}):
        fig, axes = plt.subplots(len(heads), 2, squeeze=False, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI),
                                 dpi=DPI, facecolor=bg, gridspec_kw=_layout(t, len(heads), every))
        for (grid, share), h in zip(axes, heads):
            keys = shown_keys(t, h)
            parts = h.parts[:, keys]
            top = float(np.abs(parts).max()) or 1.0
            image = grid.imshow(parts, cmap="RdBu_r", vmin=-top, vmax=top, aspect="auto")
            grid.set_xticks(range(len(keys)), [f"{token_label(t.tokens[j])}\nΔ{t.distances[j]}" for j in keys])
            ticks = list(range(0, planes, every))
            grid.set_yticks(ticks, [f"{i}: turn {turn_text(t.frequencies[i])}" for i in ticks])
            grid.set_ylabel(f"head {w.view.head_name(h.head)}", fontsize=18)
            fig.colorbar(image, ax=grid, fraction=0.04).ax.tick_params(labelsize=MIN_TICK_PT)
            size = np.abs(parts).sum(axis=1)
            share.barh(np.arange(planes), size / (size.sum() or 1.0), color="#21918c")
            share.invert_yaxis()
            share.set_yticks(ticks, [str(i) for i in ticks])
            share.xaxis.set_major_formatter(PercentFormatter(1.0))  # 2.5%, not "2%"
        axes[0][0].set_title("each plane's part of the score (q·k ÷ √d_k)", fontsize=20, color=fg)
        axes[0][1].set_title("each plane's share of Σ|part|", fontsize=20, color=fg)
        fig.suptitle(_fitted(f"The score by RoPE plane: {w.view.through(w.token, only, w.position)}", 95, 26),
                     fontsize=26, color=fg)
    _save(plt, fig, path, bg)


def _layout(t: RopePlanes, rows: int, every: int) -> dict:
    """The grid placed from what it holds, as GridSpec's keywords: on the left the head's name
    (turned) and the planes with their turns, under each row its keys and their distances (two
    lines), between the columns the colour bar's values and the plane numbers, above the titles."""
    line = text_px([], MIN_TICK_PT)[1]
    planes = [f"{i}: turn {turn_text(t.frequencies[i])}" for i in range(0, len(t.frequencies), every)]
    left = text_px([], 18)[1] + text_px(planes, MIN_TICK_PT)[0] + 28
    below = 2 * line + 16
    gap = text_px(["−0.25"], MIN_TICK_PT)[0] + text_px([str(len(t.frequencies) - 1)], MIN_TICK_PT)[0] + 40
    top, bottom = 96, below + 16  # px
    room = (HEIGHT_PX - top - bottom - (rows - 1) * below) / rows
    width = WIDTH_PX * 0.99 - left
    return {"left": left / WIDTH_PX, "right": 0.99, "top": 1 - top / HEIGHT_PX,
            "bottom": bottom / HEIGHT_PX, "hspace": below / room, "wspace": gap / ((width - gap) / 2),
            "width_ratios": [3, 2]}
