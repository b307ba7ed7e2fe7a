"""`patch --png`: the residual stream (position × layer) beside every head (layer × head), and with
--by-input the K/V groups, each cell the share of the metric's gap a patch restores (or destroys),
on one diverging scale from −1 to 1; path patching's four inputs as bars."""

import numpy as np
from matplotlib.text import Text

from mha_trace.core.head import Head
from mha_trace.analyses.path_patching import PathPatching
from mha_trace.analyses.patching import Patching
from mha_trace.io.page import slide
from mha_trace.io.units import shared
from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, TICK_PAD, WIDTH_PX, _fitted,
                                    _pyplot, _rc, _save, _theme, bar_beside, colour_bar_room,
                                    framed, heading, text_px)

WRITTEN = 64  # a grid of at most this many cells has each share written in it
MARKED = 3  # the heads that carry the most, ringed and named
RING = "#2ca02c"  # apart from both ends of the red-blue scale


@slide.register(Patching)
def patching_slide(p: Patching, path: str, theme: str = "light", **_) -> None:
    plt = _pyplot()
    fg, bg = _theme(theme)
    panels = [("residual stream", p.fraction(p.residual).T, "layer", "position"),
              ("heads' outputs", p.fraction(p.heads), "head", "layer")]
    if p.kv_groups is not None:
        panels.append(("K/V groups", p.fraction(p.kv_groups), "K/V group", "layer"))
    differ = [t for t, (a, b) in enumerate(zip(p.clean, p.corrupt)) if a != b]
    tokens = ([f"{t} {token}{'*' if t in differ else ''}" for t, token in enumerate(p.clean)]
              if len(p.clean) <= 40 else [str(t) for t in range(len(p.clean))])
    with plt.rc_context(_rc(fg)):
        fig, axes = plt.subplots(1, len(panels), figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI,
                                 facecolor=bg, gridspec_kw=_layout(tokens, p, len(panels)))
        for ax, (title, grid, across, down) in zip(axes, panels):
            image = ax.imshow(grid, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
            ax.set_facecolor(bg)
            ax.set_title(title, fontsize=22, color=fg)
            ax.set_xlabel(across, fontsize=18)
            ax.set_ylabel(down, fontsize=18)
            _ticks(ax, grid.shape[1], "x")
            _ticks(ax, grid.shape[0], "y")
            ax.tick_params(labelsize=MIN_TICK_PT)
            if grid.size <= WRITTEN:
                _write_cells(ax, grid)
        axes[0].set_yticks(range(len(p.clean)), tokens)
        if p.heads.size > WRITTEN and not p.undefined:
            _ring_top(axes[1], p.fraction(p.heads), bg)
        bar_beside(fig, image, colour_bar_room(["−1.00"]), "share of the gap " + (
            "destroyed" if p.noising else "restored") + " (1 = all of it)")
        way = "corrupted into clean" if p.noising else "clean into corrupted"
        fig.suptitle(_fitted(f"{p.card.name}: {way}, clean {p.clean_value:.2f}, corrupted "
                             f"{p.corrupt_value:.2f}", 90, 24) + "\n" + _fitted(
                                 "no gap: the two runs score the same, no share is defined"
                                 if p.undefined else p.metric, 90, 24), fontsize=24, color=fg)
    _save(plt, fig, path, bg)


def _layout(tokens: list, p: Patching, panels: int) -> dict:
    """The grids placed from what they hold: the positions' tokens on the left, each grid's
    layer numbers and axis name before it, one line of numbers and a name below, the two lines of
    the title and the grids' titles above, the colour bar on the right."""
    name, numbers = text_px([], 18)[1], text_px([str(p.heads.shape[0])], MIN_TICK_PT)[0]
    return framed(16 + name + text_px(tokens, MIN_TICK_PT)[0] + TICK_PAD, colour_bar_room(["−1.00"]),
                  heading(24, lines=2, title=22), 16 + name + text_px([], MIN_TICK_PT)[1] + TICK_PAD,
                  cols=panels, gap=name + numbers + TICK_PAD + 24,
                  width_ratios=[3, 2, 1][:panels])


def _ticks(ax, n: int, axis: str) -> None:
    """Every row or column numbered from 1 when they fit; every k-th when not."""
    step = max(1, -(-n // (15 if axis == "x" else 30)))
    (ax.set_xticks if axis == "x" else ax.set_yticks)(list(range(0, n, step)),
                                                      [str(i + 1) for i in range(0, n, step)])


def _write_cells(ax, grid: np.ndarray) -> None:
    for (row, col), x in np.ndenumerate(grid):
        ax.text(col, row, shared(x), ha="center", va="center",
                fontsize=MIN_TICK_PT + 3, color="white" if abs(x) > 0.6 else "black")


# where a ringed head's name may go, in points from its ring: nearest first (right and up before
# the other corners); the first that keeps clear of the names placed and of the panel's edge
PLACES = sorted(((dx, dy) for dx in (14, -14, 60, -60, 110, -110) for dy in (10, -24, 26, -40, 42, -56)),
                key=lambda p: (abs(p[0]) + abs(p[1]), p[0] < 0, p[1] < 0))


def _ring_top(ax, f: np.ndarray, bg: str) -> None:
    """The MARKED heads that carry the most, ringed, each with its name and share, the names
    placed apart (two neighbouring heads' names never over each other)."""
    placed = []
    renderer = ax.figure.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    for i in np.argsort(-np.abs(f).ravel(), kind="stable")[:MARKED]:
        layer, head = divmod(int(i), f.shape[1])
        ax.scatter([head], [layer], s=500, facecolors="none", edgecolors=RING, linewidths=3, zorder=3)
        for dx, dy in PLACES:
            label = ax.annotate(f"{Head.at(layer, head)} {shared(f[layer, head], True)}", (head, layer),
                                xytext=(dx, dy), textcoords="offset points", color=RING,
                                ha="left" if dx > 0 else "right", fontsize=MIN_TICK_PT,
                                fontweight="bold", zorder=4, bbox={"boxstyle": "round,pad=0.15",
                                                                  "facecolor": bg, "edgecolor": "none"},
                                arrowprops=None if (dx, dy) in PLACES[:4] else  # far: a line to its ring
                                {"arrowstyle": "-", "color": RING, "linewidth": 1.5, "shrinkB": 12})
            label.update_positions(renderer)
            box = Text.get_window_extent(label, renderer)  # the name's own box, not its line
            inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
            if inside and not any(box.overlaps(other) for other in placed):
                break
            label.remove()
        else:  # no place clear: the ring alone (its name is in the terminal's list and the JSON)
            continue
        placed.append(box)


@slide.register(PathPatching)
def path_slide(p: PathPatching, path: str, theme: str = "light", **_) -> None:
    plt = _pyplot()
    fg, bg = _theme(theme)
    names = {"q": "its queries", "k": "its keys", "v": "its values", "qkv": "all three"}
    shares = [p.fraction(p.via[key]) for key in names]
    senders, (rl, rh) = p.sender_names, p.receiver
    routes = [f"through {name}" for name in names.values()]
    left = 16 + text_px(routes, 24)[0] + TICK_PAD
    below = 16 + text_px([], 22)[1] + text_px([], MIN_TICK_PT + 3)[1] + TICK_PAD
    with plt.rc_context(_rc(fg)):
        fig, ax = plt.subplots(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, facecolor=bg,
                               gridspec_kw=framed(left, 32, heading(26, lines=2), below))
        ax.set_facecolor(bg)
        ax.barh(range(4), shares, color=["#3b528b", "#d62728", "#5ec962", "#888888"], height=0.6)
        for y, share in enumerate(shares):
            ax.text(0 if share != share else share, y, f"  {shared(share, True)}  ", va="center",
                    ha="right" if share < 0 else "left", fontsize=24, color=fg)
        ax.set_yticks(range(4), routes, fontsize=24)
        ax.invert_yaxis()
        ax.axvline(0, color=fg, linewidth=1)
        known = np.nan_to_num(shares)  # an undefined share (no gap) draws no bar
        ax.set_xlim(min(-0.1, known.min() - 0.25), max(1.1, known.max() + 0.25))
        ax.set_xlabel("share of the gap " + ("destroyed" if p.noising else "restored"), fontsize=22)
        ax.tick_params(axis="x", labelsize=MIN_TICK_PT + 3)
        whose = f"head {senders}'s output" if len(p.senders) == 1 else f"heads {senders}, together,"
        fig.suptitle(_fitted(f"{p.card.name}: {whose} into head {Head(rl, rh)}", 90, 26) + "\n" + _fitted(
            "no gap: the two runs score the same, no share is defined" if p.undefined else p.metric,
            90, 26), fontsize=26, color=fg)
    _save(plt, fig, path, bg)
