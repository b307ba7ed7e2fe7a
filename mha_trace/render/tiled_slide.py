"""The tiled walk's slide (`explain --impl tiled --png`): for each head, the scores of each key
tile with the running max m after it, the running sum ℓ tile by tile (what the rescale kept of the
old sum, and what the tile added), and the output o ÷ ℓ after each tile closing in on the row's."""

import math

import numpy as np

from mha_trace.analyses.tiled_walk import TiledWalk
from mha_trace.io.page import slide
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, WIDTH_PX, _fitted, _pyplot, _rc,
                                    _save, _theme, bars, rows_layout, slide_heads, text_px,
                                    token_label)

ROTATED_PAST = 8  # keys: more than this many are written turned
KEYS_NAMED = 32  # keys named under the scores at most: past it, every k-th (a row of 1,024 keys)
TILES_WRITTEN = 8  # tiles whose m, rescale and ℓ are written at most: past it, drawn alone
TILES_NAMED = 6  # tiles named under ℓ and o ÷ ℓ at most: past it, every k-th
LINE = 13 * 1.4 * DPI / 72  # px: a line of the 13-point labels written in the axes
GAP = 64  # px: between the columns, for their values
TILE_COLOURS = ["#3b528b", "#21918c", "#5ec962", "#f58231", "#e6194b", "#911eb4"]


@slide.register(TiledWalk)
def tiled_slide(t: TiledWalk, path: str, theme: str = "light", head: int | None = None, **_) -> None:
    only = head or t.walk.only
    heads = slide_heads(t.walk, t.heads, only)
    w = t.walk
    title = f"Tiles of {t.block_k} key{'s' * (t.block_k != 1)}: {w.view.through(w.token, only, w.position)}"
    plt = _pyplot()
    fg, bg = _theme(theme)
    small = {"xtick.labelsize": MIN_TICK_PT, "ytick.labelsize": MIN_TICK_PT, "axes.facecolor": bg}
    with plt.rc_context({**_rc(fg), **small}):
        fig, axes = plt.subplots(len(heads), 3, squeeze=False, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI),
                                 dpi=DPI, facecolor=bg, gridspec_kw=_layout(heads, w))
        tall = axes[0][0].get_window_extent().height  # px: the grid is placed before it is drawn
        for i, (row, h) in enumerate(zip(axes, heads)):
            _scores(row[0], h, fg, w.view.head_name(h.head), tall)
            _sums(row[1], h, fg, tall, legend=i == 0)  # the legends once, on the first row
            _outputs(row[2], h, fg, tall, legend=i == 0)
        for ax, name in zip(axes[0], ("score ÷ √d_k by key tile; the running max m",
                                      "the running sum ℓ",
                                      "o ÷ ℓ by tile; dashed: the end")):
            ax.set_title(name, fontsize=20, color=fg)
        fig.suptitle(_fitted(title, 95, 26), fontsize=26, color=fg)
    _save(plt, fig, path, bg)


def _layout(heads: list, walk) -> dict:
    """The grid placed from what it holds, as GridSpec's keywords: on the left the rows' names
    and values, under each row its keys (upright, or turned when there are more than 8) and
    tiles, between the columns their values, above the titles."""
    keys = [token_label(k) for k in walk.view.tokens][::_step(len(walk.view.tokens), KEYS_NAMED)]
    turned = len(walk.view.tokens) > ROTATED_PAST
    below = (text_px(keys, MIN_TICK_PT)[0] if turned else text_px([], MIN_TICK_PT)[1]) + 18
    names = [f"head {walk.view.head_name(h.head)}" for h in heads]
    layout = rows_layout(names, [], MIN_TICK_PT, legend_rows=0)
    room = (layout["top"] - layout["bottom"]) * HEIGHT_PX - len(heads) * below  # the rows' own
    width = (layout["right"] - layout["left"]) * WIDTH_PX
    return {**layout, "bottom": layout["bottom"] + below / HEIGHT_PX, "width_ratios": [5, 3, 3],
            "hspace": below / (room / len(heads)), "wspace": 3 * GAP / (width - 2 * GAP)}


def _step(n: int, most: int) -> int:
    """Every k-th of n marks named, so that at most `most` are."""
    return -(-n // most)


def _name_tiles(ax, n: int) -> None:
    """"tile 1", "tile 2" ... under a few tiles; under many, every k-th tile's number and "tile"."""
    xs = np.arange(1, n + 1)[::_step(n, TILES_NAMED)]
    ax.set_xticks(xs, [f"tile {x}" if n <= TILES_WRITTEN else str(x) for x in xs])
    if n > TILES_WRITTEN:
        ax.set_xlabel("tile", fontsize=MIN_TICK_PT)


def _above(ax, lo: float, hi: float, tall: float, px: float) -> None:
    """The axis from `lo` to above `hi`, with `px` pixels (of the axes' `tall`) left over `hi`."""
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    ax.set_ylim(lo, hi + (hi - lo or 1.0) * px / max(tall - px, 1.0))


def _scores(ax, h, fg: str, name: str, tall: float) -> None:
    """Bars of each key's score, coloured by tile; the running max m as a step over each tile,
    named above it (two lines: room is kept for them)."""
    x, labels, colours, scores, steps = 0, [], [], [], []
    for i, tile in enumerate(h.tiles):
        colours += [TILE_COLOURS[i % len(TILE_COLOURS)]] * len(tile.keys)
        scores += [s if s > -math.inf else 0.0 for s in tile.scores]
        last = x + len(tile.keys) - 1
        if tile.m_new > -math.inf:
            steps.append((tile.m_new, x - 0.45, last + 0.45))
        if tile.m_new > -math.inf and len(h.tiles) <= TILES_WRITTEN:
            word = "rescale " if len(tile.keys) > 2 else ""  # over a narrow tile: "×0.49" alone
            rescale = f"\n{word}×{tile.rescale:.2f}" if i else ""  # the first tile has no sum yet
            ax.text(last + 0.45, tile.m_new, f"m={tile.m_new:.2f}{rescale}",
                    fontsize=14, color=fg, va="bottom", ha="right")
        labels += [token_label(k) for k in tile.keys]
        x += len(tile.keys)
    bars(ax, np.arange(x), scores, 0.7, color=colours)  # one collection for every key (1,024 tiles)
    if steps:
        ax.hlines(*zip(*steps), color=fg, linewidth=3)
    ax.axhline(0, color=fg, linewidth=0.8)
    named = range(0, len(labels), _step(len(labels), KEYS_NAMED))
    ax.set_xticks(named, [labels[i] for i in named], rotation=90 if len(labels) > ROTATED_PAST else 0)
    shown = [s for t in h.tiles for s in [*t.scores, t.m_new] if s > -math.inf]
    _above(ax, min(shown, default=0.0) * 1.1, max(shown, default=0.0), tall, 2 * LINE + 8)
    ax.set_ylabel(f"head {name}", fontsize=18, rotation=0, ha="right", va="center")


def _sums(ax, h, fg: str, tall: float, legend: bool) -> None:
    """Each tile's ℓ as a stack: what the rescale kept of the old sum, and the tile's Σ p; with
    `legend`, which is which, above the tallest."""
    xs = np.arange(1, len(h.tiles) + 1)
    kept = np.array([t.rescale * t.l_old for t in h.tiles])
    added = np.array([t.l_new - t.rescale * t.l_old for t in h.tiles])
    bars(ax, xs, kept, 0.6, color="#888888", label="rescale × ℓ_old")
    bars(ax, xs, added, 0.6, bottom=kept, color="#21918c", label="Σ p of the tile")
    for x, t in zip(xs, h.tiles) if len(h.tiles) <= TILES_WRITTEN else ():
        ax.text(x, t.l_new, f"{t.l_new:.2f}", ha="center", va="bottom", fontsize=14, color=fg)
    _name_tiles(ax, len(h.tiles))
    _above(ax, 0.0, max(t.l_new for t in h.tiles), tall, LINE + 8 + (2 * LINE + 12) * legend)
    if legend:
        ax.legend(fontsize=13, frameon=False, labelcolor=fg, loc="upper left")


def _outputs(ax, h, fg: str, tall: float, legend: bool) -> None:
    """The first dims of o ÷ ℓ after each tile, each closing in on the explicit row's (dashed);
    with `legend`, which colour is which dim, in a line above them."""
    xs = np.arange(1, len(h.tiles) + 1)
    dims = min(4, len(h.output))
    for d in range(dims):
        colour = TILE_COLOURS[d % len(TILE_COLOURS)]
        so_far = [t.o[d] / t.l_new if t.l_new else 0.0 for t in h.tiles]
        ax.plot(xs, so_far, "o-" if len(xs) <= 4 * TILES_NAMED else "-", color=colour, linewidth=2,
                markersize=8, label=f"dim {d}")
        ax.axhline(h.explicit[d], color=colour, linestyle="--", linewidth=1.5)
    _name_tiles(ax, len(h.tiles))
    if legend:
        values = [v for line in ax.get_lines() for v in line.get_ydata()]
        _above(ax, min(values), max(values), tall, LINE + 12)
        ax.legend(fontsize=13, frameon=False, labelcolor=fg, loc="upper center", ncols=dims,
                  handlelength=1.2, columnspacing=1.0)
