"""The tiled walk's slide (`explain --impl tiled --png`): for each head, the scores of each key
tile with the running max m after it, the running sum ℓ tile by tile (what the rescale kept of the
old sum, and what the tile added), and the output o ÷ ℓ after each tile closing in on the row's."""

import math

import numpy as np

from mha_trace.analyses.tiled_walk import TiledWalk
from mha_trace.io.page import slide
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, WIDTH_PX, _fitted, _pyplot, _rc,
                                    _save, _theme, slide_heads, bars, token_label)

TILE_COLOURS = ["#3b528b", "#21918c", "#5ec962", "#f58231", "#e6194b", "#911eb4"]


@slide.register(TiledWalk)
def tiled_slide(t: TiledWalk, path: str, theme: str = "light", head: int | None = None, **_) -> None:
    only = head or t.walk.only
    heads = slide_heads(t.walk, t.heads, only)
    w = t.walk
    title = f"Tiles of {t.block_k} keys: {w.view.through(w.token, only, w.position)}"
    plt = _pyplot()
    fg, bg = _theme(theme)
    small = {"xtick.labelsize": MIN_TICK_PT, "ytick.labelsize": MIN_TICK_PT, "axes.facecolor": bg}
    with plt.rc_context({**_rc(fg), **small}):
        fig, axes = plt.subplots(len(heads), 3, squeeze=False, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI),
                                 dpi=DPI, facecolor=bg, constrained_layout=True,
                                 gridspec_kw={"width_ratios": [5, 3, 3]})
        for i, (row, h) in enumerate(zip(axes, heads)):
            _scores(row[0], h, fg, w.view.head_name(h.head))
            _sums(row[1], h, fg)
            _outputs(row[2], h, fg, legend=i == 0)  # the dims' colours, named once
        for ax, name in zip(axes[0], ("score ÷ √d_k by key tile; the running max m",
                                      "the running sum ℓ",
                                      "o ÷ ℓ so far; dashed: the row's")):
            ax.set_title(name, fontsize=20, color=fg)
        fig.suptitle(_fitted(title, 95), fontsize=26, color=fg)
    _save(plt, fig, path, bg)


def _scores(ax, h, fg: str, name: str) -> None:
    """Bars of each key's score, coloured by tile; the running max m as a step over each tile."""
    x, labels = 0, []
    for i, tile in enumerate(h.tiles):
        colour = TILE_COLOURS[i % len(TILE_COLOURS)]
        xs = np.arange(x, x + len(tile.keys))
        scores = np.array([s if s > -math.inf else 0.0 for s in tile.scores])
        bars(ax, xs, scores, 0.7, color=colour)
        if tile.m_new > -math.inf:
            ax.hlines(tile.m_new, xs[0] - 0.45, xs[-1] + 0.45, color=fg, linewidth=3)
            rescale = f"\nrescale ×{tile.rescale:.2f}" if i else ""  # the first tile has no sum yet
            ax.text(xs[-1] + 0.45, tile.m_new, f"m={tile.m_new:.2f}{rescale}",
                    fontsize=14, color=fg, va="bottom", ha="right")
        labels += [token_label(k) for k in tile.keys]
        x += len(tile.keys)
    ax.axhline(0, color=fg, linewidth=0.8)
    ax.set_xticks(range(len(labels)), labels, rotation=90 if len(labels) > 8 else 0)
    ax.margins(y=0.4)  # room above the highest m for its two lines
    ax.set_ylabel(f"head {name}", fontsize=18, rotation=0, ha="right", va="center")


def _sums(ax, h, fg: str) -> None:
    """Each tile's ℓ as a stack: what the rescale kept of the old sum, and the tile's Σ p."""
    xs = np.arange(1, len(h.tiles) + 1)
    kept = np.array([t.rescale * t.l_old for t in h.tiles])
    added = np.array([t.l_new - t.rescale * t.l_old for t in h.tiles])
    bars(ax, xs, kept, 0.6, color="#888888", label="rescale × ℓ_old")
    bars(ax, xs, added, 0.6, bottom=kept, color="#21918c", label="Σ p of the tile")
    for x, t in zip(xs, h.tiles):
        ax.text(x, t.l_new, f"{t.l_new:.2f}", ha="center", va="bottom", fontsize=14, color=fg)
    ax.set_xticks(xs, [f"tile {x}" for x in xs])
    ax.set_ylim(0, max(t.l_new for t in h.tiles) * 1.6 or 1.0)  # the legend above the tallest
    ax.legend(fontsize=13, frameon=False, labelcolor=fg, loc="upper left")


def _outputs(ax, h, fg: str, legend: bool = True) -> None:
    """The first dims of o ÷ ℓ after each tile, each closing in on the explicit row's (dashed);
    with `legend`, which colour is which dim."""
    xs = np.arange(1, len(h.tiles) + 1)
    dims = min(4, len(h.output))
    for d in range(dims):
        colour = TILE_COLOURS[d % len(TILE_COLOURS)]
        so_far = [t.o[d] / t.l_new if t.l_new else 0.0 for t in h.tiles]
        ax.plot(xs, so_far, "o-", color=colour, linewidth=2, markersize=8, label=f"dim {d}")
        ax.axhline(h.explicit[d], color=colour, linestyle="--", linewidth=1.5)
    ax.set_xticks(xs, [f"tile {x}" for x in xs])
    if legend:
        ax.legend(fontsize=13, frameon=False, labelcolor=fg, loc="best")
