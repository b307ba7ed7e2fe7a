"""`survey --composition --png`: Q-, K- and V-composition side by side, each an earlier head (rows)
against a later head (columns), as a multiple of random matrices' score (1 = random)."""

import numpy as np

from mha_trace.core.head import Head, head_names
from mha_trace.analyses.composition import Composition
from mha_trace.core.composition import KINDS
from mha_trace.io.page import slide
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, TICK_PAD, WIDTH_PX, _fitted,
                                    _pyplot, _rc, _save, _theme, bar_beside, colour_bar_room,
                                    framed, heading, text_px)

LABELLED = 24  # every head named on the axes up to this many; layers only beyond
MARKED = 3  # the strongest pairs of each kind, circled and named
RING = "#ff3b30"  # seen on every colour of viridis
AWAY = [(11, 11), (11, -26), (-26, 11)]  # points: each mark's name off its ring, apart when rings touch


@slide.register(Composition)
def composition_slide(c: Composition, path: str, theme: str = "light", **_) -> None:
    plt = _pyplot()
    fg, bg = _theme(theme)
    base = float(c.baseline.mean())
    writers = [i for i, (l, _) in enumerate(c.heads) if l < c.model.layers]
    readers = [i for i, (l, _) in enumerate(c.heads) if l > 1]
    grids = {kind: c.scores[kind][np.ix_(writers, readers)] / base for kind in KINDS}
    top = max(float(np.nanmax(g)) for g in grids.values())
    across, down = _names([c.heads[i] for i in readers]), _names([c.heads[i] for i in writers])
    with plt.rc_context(_rc(fg)):
        fig, axes = plt.subplots(1, 3, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI,
                                 facecolor=bg, gridspec_kw=_layout(across[1], down[1], top))
        for ax, kind in zip(axes, KINDS):
            image = ax.imshow(np.ma.masked_invalid(grids[kind]), cmap="viridis", vmin=0, vmax=top,
                              aspect="auto", interpolation="nearest")
            ax.set_facecolor(bg)
            ax.set_title(f"{kind}-composition", fontsize=24, color=fg)
            ax.set_xticks(*across, rotation=90)
            ax.set_yticks(*down)
            ax.set_xlabel("the later head (reads)", fontsize=18)
            ax.tick_params(labelsize=MIN_TICK_PT)
            _mark_strongest(ax, c, kind, writers, readers, base, fg, bg)
        axes[0].set_ylabel("the earlier head (writes)", fontsize=18)
        bar_beside(fig, image, colour_bar_room([f"{top:.1f}"]),
                   f"× random matrices of the same shapes ({base:.3f})")
        fig.suptitle(_fitted(f"{c.model.name}: which earlier head each head reads (blank: not an "
                             f"earlier layer)", 95, 28), fontsize=28, color=fg)
    _save(plt, fig, path, bg)


def _mark_strongest(ax, c: Composition, kind: str, writers: list, readers: list, base: float,
                    fg: str, bg: str) -> None:
    """The MARKED strongest pairs of a kind circled and numbered (one cell of a 261 × 261 grid is
    a few pixels), and named in the grid's empty corner (an earlier head never reads a later one);
    in a two-layer grid, where every cell holds a pair and each is named on the axes, each ring
    carries its score."""
    names, corner = [], c.model.layers > 2  # two layers: every cell holds a pair
    for rank, (a, b, x) in enumerate(c.strongest(kind, MARKED), start=1):
        row, col = writers.index(c.heads.index(a)), readers.index(c.heads.index(b))
        ax.scatter([col], [row], s=420, facecolors="none", edgecolors=RING, linewidths=2.5, zorder=3)
        ax.annotate(str(rank) if corner else f"{rank}: {x / base:.1f}×", (col, row), xytext=AWAY[rank - 1],
                    textcoords="offset points", color=RING, fontsize=MIN_TICK_PT,
                    fontweight="bold", zorder=4, bbox={"boxstyle": "round,pad=0.15",
                                                       "facecolor": bg, "edgecolor": "none"})
        names.append(f"{rank}: {Head(*a)} → {Head(*b)}  {x / base:.1f}×")
    if corner:  # the heads are named on the axes otherwise
            ax.text(0.03, 0.03, "\n".join(["strongest (circled):", *names]), transform=ax.transAxes,
                ha="left", va="bottom", fontsize=MIN_TICK_PT, color=fg, linespacing=1.4,
                bbox={"boxstyle": "round,pad=0.4", "facecolor": bg, "edgecolor": RING}, zorder=4)


def _names(heads: list) -> tuple[list, list]:
    """(ticks, names): every head's name when there are few; otherwise each layer's first head."""
    if len(heads) <= LABELLED:
        return list(range(len(heads))), head_names(heads)
    firsts = [i for i, (l, h) in enumerate(heads) if h == 1]
    step = max(1, len(firsts) // 15)
    return firsts[::step], [f"L{heads[i][0]}" for i in firsts[::step]]


def _layout(across: list, down: list, top: float) -> dict:
    """The three grids placed from what they hold: the earlier heads' names on the left and
    between the grids, the later heads' (turned) and the axis name below, the titles above, the
    colour bar on the right."""
    name = text_px([], 18)[1]
    names = text_px(down, MIN_TICK_PT)[0] + TICK_PAD
    return framed(16 + name + names, colour_bar_room([f"{top:.1f}"]), heading(28, title=24),
                  16 + name + text_px(across, MIN_TICK_PT)[0] + TICK_PAD, cols=3, gap=names + 24)
