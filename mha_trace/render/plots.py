"""PNG heatmaps for slides, with matplotlib (an optional extra, imported only for --png).

Made to be read from the back of a room: every picture is one 1920×1080 slide, its panels in the
grid that gives them the most room, labels of at least 18 px, one colour scale per slide from 0
with its colour bar (the viridis ramp the terminal uses), masked cells hatched, and a light or a
dark theme (slides are usually white).
"""

import contextlib
import os

from mha_trace.errors import MhaError

WIDTH_PX, HEIGHT_PX, DPI = 1920, 1080, 100


def _pyplot():
    """pyplot on the Agg backend. Where its config directory cannot be written (a read-only
    HOME), matplotlib falls back to a temporary one and says so on stderr: a note for the user
    of matplotlib, not of mha-trace, so it is kept quiet while importing (logging restored)."""
    import logging
    import sys

    log = logging.getLogger("matplotlib")
    level = log.level
    log.setLevel(logging.ERROR + 1)
    try:
        import matplotlib

        if "matplotlib.pyplot" not in sys.modules:  # a notebook's own backend is left as it is
            matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MhaError('--png needs matplotlib (install it with: pip install matplotlib, or from a '
                       'clone: pip install ".[plot]")', exit_code=1) from None
    finally:
        log.setLevel(level)
    return plt


def _theme(theme: str) -> tuple[str, str]:
    return ("white", "#1e1e1e") if theme == "dark" else ("black", "white")


def _rc(fg: str) -> dict:
    return {"text.color": fg, "axes.labelcolor": fg, "xtick.color": fg, "ytick.color": fg,
            "axes.edgecolor": fg, "font.size": 18, "hatch.color": "#888888"}


_together = None  # inside `written_together`: the PNGs made so far, not yet written


@contextlib.contextmanager
def written_together():
    """PNGs saved inside are written only once every one is made: a run stopped halfway
    (Ctrl-C, an error) leaves none of them."""
    from mha_trace.io.files import write_atomic

    global _together
    _together, written = [], []
    try:
        yield
        for path, data in _together:
            write_atomic(path, data, "png")
            written.append(path)
    except BaseException:  # a full disk halfway through: none of the set stays
        for path in written:
            os.unlink(path)
        raise
    finally:
        _together = None


def _png(plt, fig, bg: str) -> bytes:
    import io

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=DPI, facecolor=bg, metadata={"Software": None})
    finally:
        plt.close(fig)
    return buffer.getvalue()


def _save(plt, fig, path: str, bg: str) -> None:
    from mha_trace.io.files import write_atomic

    data = _png(plt, fig, bg)
    if _together is not None:
        _together.append((path, data))
    else:
        write_atomic(path, data, "png")


def _fitted(title: str, limit: int) -> str:
    """A title that fits across the slide (a long sentence is cut, with an ellipsis)."""
    return title if len(title) <= limit else title[:limit - 1].rstrip() + "…"


def layer_paths(path: str, layers: int) -> list[str]:
    """The per-layer files beside a model's overview: heads.png -> heads-layer01.png, ..."""
    stem = path[:-len(".png")]
    return [f"{stem}-layer{l:0{len(str(layers))}d}.png" for l in range(1, layers + 1)]


def save_model(path: str, title: str, tokens: list, weights, causal: bool,
               decimals: int = 4, theme: str = "light", on_figure=lambda: None,
               top: float | None = None) -> list[str]:
    """A model's heads for slides: `path` gets the overview grid (every layer.head as a small
    tile on one colour scale), and one figure per layer goes beside it (layer_paths), all
    written at the end (`on_figure()` after each is made). Returns the files, the overview first."""
    import numpy as np

    from mha_trace.core.masks import allowed

    w = np.asarray(weights, float)
    L, H, T, _ = w.shape
    mask = allowed(T, "causal") if causal else None
    paths = layer_paths(path, L)
    with written_together():
        for l, layer_path in enumerate(paths):
            save_heatmaps(layer_path, f"{title}, layer {l + 1}",
                          [(f"head {l + 1}.{h + 1}", tokens, tokens, w[l, h], mask)
                           for h in range(H)], decimals, theme, top=top)
            on_figure()
        save_overview(path, title, w, mask, theme, top)
    return [path, *paths]


def save_overview(path: str, title: str, w, mask, theme: str, top: float | None = None) -> None:
    """Every head as a tile of one mosaic: layers down and heads across, or the other way round
    when there are more layers than heads (so the grid fills a wide slide)."""
    plt = _pyplot()
    import numpy as np

    L, H, T, _ = w.shape
    across = L > H  # layers across the slide
    rows, cols = (H, L) if across else (L, H)
    gap = max(1, T // 6)
    mosaic = np.full((rows * (T + gap) - gap, cols * (T + gap) - gap), np.nan)
    for l in range(L):
        for h in range(H):
            r, c = (h, l) if across else (l, h)
            tile = w[l, h] if mask is None else np.where(mask, w[l, h], np.nan)
            mosaic[r * (T + gap):r * (T + gap) + T, c * (T + gap):c * (T + gap) + T] = tile
    fg, bg = _theme(theme)
    with plt.rc_context(_rc(fg)):
        fig, ax = plt.subplots(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, facecolor=bg,
                               constrained_layout=True)
        ax.set_facecolor(bg)
        cmap = plt.get_cmap("viridis").with_extremes(bad=bg)
        hi = top or float(np.nanmax(mosaic))
        image = ax.imshow(mosaic, cmap=cmap, interpolation="nearest", aspect="auto", vmin=0.0,
                          vmax=hi)
        centres = [i * (T + gap) + (T - 1) / 2 for i in range(max(rows, cols))]
        row_name, col_name = ("head", "layer") if across else ("layer", "head")
        ax.set_xticks(centres[:cols], [str(i + 1) for i in range(cols)],
                      fontsize=18 if cols <= 16 else 12)
        ax.set_yticks(centres[:rows], [str(i + 1) for i in range(rows)],
                      fontsize=18 if rows <= 16 else 12)
        ax.set_xlabel(f"{col_name}  (each tile: queries down, keys across)", fontsize=20)
        ax.set_ylabel(row_name, fontsize=20)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        bar = fig.colorbar(image, ax=ax, shrink=0.8)
        blank = ", blank: masked" if mask is not None else ""
        bar.set_label(f"attention weight (0 to {hi:.2f}{blank})", fontsize=18)
        fig.suptitle(f"{_fitted(title, 110)}\nevery head: {L} layers × {H} heads", fontsize=24,
                     color=fg)
    _save(plt, fig, path, bg)


SLIDE_W, SLIDE_H = WIDTH_PX, HEIGHT_PX - 140  # the title takes the top of the slide
MIN_TICK_PT = 13  # 18 px at 100 dpi: the smallest label readable from the back of a hall


def grid(n: int, cols: int | None = None) -> tuple[int, int]:
    """(rows, cols) for n square panels on a 16:9 slide: the grid whose panels are largest, or
    one with no empty slot shaped most like the slide when its panels are nearly as large (12 ->
    3 × 4, 8 -> 2 × 4; 9 -> 2 × 5 with one slot empty, since 3 × 3 leaves half the width unused;
    7 -> 2 × 4, not 1 × 7)."""
    import math

    if cols:
        return -(-n // cols), cols
    grids = [(r, -(-n // r)) for r in range(1, n + 1)]
    side = lambda rc: min(SLIDE_W / rc[1], SLIDE_H / rc[0])
    best = max(grids, key=side)
    full = [rc for rc in grids if rc[0] * rc[1] == n]
    shaped = min(full, key=lambda rc: abs(math.log(rc[1] / rc[0] / (16 / 9))))
    return shaped if side(shaped) >= 0.9 * side(best) else best


def packed(groups: list[list]) -> tuple[list, int]:
    """(panels with None for empty slots, columns): groups of panels (one head count's heads) in
    rows as wide as the widest group, a group joining the row it fits in whole, so 1, 2 and 4
    heads take two rows (1 + 2, then 4), not a staircase of three."""
    cols, rows = max(map(len, groups)), []
    for group in groups:
        if rows and len(rows[-1]) + len(group) <= cols:
            rows[-1] += group
        else:
            rows.append(list(group))
    return [p for row in rows for p in row + [None] * (cols - len(row))], cols


def _ticks(n: int, room_px: float) -> tuple[list[int], float]:
    """Which of n labels to write along room_px pixels, and their size in points: every label
    when each gets MIN_TICK_PT, else every k-th, never below it."""
    size = min(18.0, room_px / max(n, 1) / 1.3 * 72 / DPI)
    step = 1 if size >= MIN_TICK_PT else -(-n // int(room_px / (MIN_TICK_PT * 1.3 * DPI / 72)))
    return list(range(0, n, step)), max(size, MIN_TICK_PT)


def save_heatmaps(path: str, title: str, panels: list, decimals: int = 4, theme: str = "light",
                  cols: int | None = None, top: float | None = None,
                  groups: list | None = None) -> None:
    """panels: (title, row labels, column labels, matrix, mask or None) or None for an empty
    slot, on one 1920×1080 slide in the grid that gives them the most room (or `cols` to a row). One colour scale for the
    slide from 0 (the darkest colour always means no attention) to `top`, or to the slide's
    largest weight; masked cells hatched; values written in when the cells are big enough;
    with `groups` (a K/V head per panel) the panels that share one are framed alike."""
    plt = _pyplot()
    import numpy as np

    rows, cols = grid(len(panels), cols)
    values = np.concatenate([np.asarray(m)[np.asarray(k, bool)] if k is not None else np.ravel(m)
                             for _, _, _, m, k in filter(None, panels)])
    hi = top or max(float(values.max()), 1e-9)
    fg, bg = _theme(theme)
    with plt.rc_context(_rc(fg)):
        fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI),
                                 dpi=DPI, facecolor=bg, layout="compressed")
        drawn = [(ax, panel) for ax, panel in zip(axes.flat, panels) if panel]
        for ax in set(axes.flat) - {ax for ax, _ in drawn}:  # a slot left empty
            ax.axis("off")
        shared = len({(tuple(p[1]), tuple(p[2])) for _, p in drawn}) == 1  # one sentence's heads
        room = min(SLIDE_W / cols, SLIDE_H / rows) * (0.85 if shared else 0.7)  # a panel's cells
        images = [_panel(ax, panel, hi, decimals, fg, bg, room) for ax, panel in drawn]
        if shared:
            _label_edges(axes, [bool(p) for p in panels])
        if groups:
            _frame_groups([ax for ax, _ in drawn], groups, [p for _, p in drawn])
        bar = fig.colorbar(images[-1], ax=axes.ravel().tolist(), shrink=0.8)
        bar.set_label(f"attention weight (0 to {hi:.2f}{', fixed' if top else ''})", fontsize=18)
        bar.ax.tick_params(labelsize=16)
        fig.suptitle(_fitted(title, 95), fontsize=28, color=fg)
    _save(plt, fig, path, bg)


def _label_edges(axes, drawn: list) -> None:
    """Panels with the same tokens: queries named at the first panel of each row only, keys under
    the lowest panel of each column only, so the cells get the room the labels took."""
    rows, cols = axes.shape
    at = lambda r, c: r * cols + c < len(drawn) and drawn[r * cols + c]
    for r in range(rows):
        for c in range(cols):
            if not at(r, c):
                continue
            if any(at(r, k) for k in range(c)):
                axes[r, c].tick_params(labelleft=False)
                axes[r, c].set_ylabel("")
            if any(at(k, c) for k in range(r + 1, rows)):
                axes[r, c].tick_params(labelbottom=False)
                axes[r, c].set_xlabel("")


def _frame_groups(axes, groups: list, panels: list) -> None:
    """Grouped-query attention drawn: each K/V head's query heads framed in one colour, their
    titles naming it."""
    import matplotlib

    colours = matplotlib.colormaps["tab10"]
    for ax, group, panel in zip(axes, groups, panels):
        for side in ax.spines.values():
            side.set_visible(True)
            side.set_edgecolor(colours(group % 10))
            side.set_linewidth(6)
        ax.set_title(f"{panel[0]} · K/V head {group + 1}", fontsize=22, color=colours(group % 10))


def _panel(ax, panel, hi: float, decimals: int, fg: str, bg: str, room: float):
    """One heatmap on `ax`: (title, row labels, column labels, matrix, mask or None); masked
    cells hatched, values written in when a cell is at least 60 px. Returns the image."""
    import numpy as np

    name, row_labels, col_labels, matrix, mask = panel
    matrix = np.asarray(matrix, float)
    shown = np.ma.masked_where(~np.asarray(mask, bool), matrix) if mask is not None else matrix
    ax.set_facecolor(bg)
    image = ax.imshow(shown, cmap="viridis", vmin=0.0, vmax=hi)
    if mask is not None:  # masked cells: hatched, never a colour that reads as a weight
        _hatch(ax, ~np.asarray(mask, bool))
    ax.set_title(name, fontsize=22, color=fg)
    rows, cols = matrix.shape
    xs, xsize = _ticks(cols, room)
    ys, ysize = _ticks(rows, room)
    ax.set_xticks(xs, [col_labels[j] for j in xs], rotation=90, fontsize=xsize)
    ax.set_yticks(ys, [row_labels[i] for i in ys], fontsize=ysize)
    ax.set_xlabel("key", fontsize=18)
    ax.set_ylabel("query", fontsize=18)
    if room / max(rows, cols) >= 60:
        for i in range(rows):
            for j in range(cols):
                if mask is None or mask[i][j]:
                    v = matrix[i][j]
                    ax.text(j, i, f"{v:.{min(decimals, 2)}f}", ha="center", va="center",
                            fontsize=16, color="black" if v / hi > 0.6 else "white")
    return image


def effect_panels(panels: list, effect, where: list, groups: list | None = None) -> tuple:
    """With effect weights (layers, heads, T, T): each heatmap panel followed by its head's
    effect weights (`where`: each panel's (layer, head), from 0), and each K/V group doubled."""
    if effect is None:
        return panels, groups
    out = []
    for (name, rows, cols, _, mask), (l, h) in zip(panels, where):
        out += [(name, rows, cols, _, mask), (f"{name} effect", rows, cols, effect[l][h], mask)]
    return out, None if groups is None else [g for g in groups for _ in (0, 1)]


def _values_on(ax, xs, values, fg: str, size: int) -> None:
    """Each bar's value written at its end (above a positive bar, below a negative one; a 0 on
    the axis, so a score of 0 reads as 0 rather than as nothing), with room made for the text."""
    lo, hi = min(0.0, float(min(values))), max(0.0, float(max(values)))
    pad = 0.18 * ((hi - lo) or 1.0)
    ax.set_ylim(lo - (pad if lo < 0 else 0), hi + pad)
    for x, v in zip(xs, values):
        ax.text(x, v, f"{v:.2f}", ha="center", va="bottom" if v >= 0 else "top", fontsize=size,
                color=fg)


def _weights_on(ax, xs, values, fg: str, size: int, rotation: int = 0) -> None:
    """Each weight of 0.03 or more written above its bar (a row of 0.00s would hide the ones
    that count), with room made above the tallest."""
    import numpy as np

    values = np.asarray(values, dtype=float)
    ax.set_ylim(0, max(float(values.max()), 1e-9) * (1.3 if rotation else 1.15))
    for x, w in zip(xs, values):
        if w >= 0.03:
            ax.text(x, w, f"{w:.2f}", ha="center", va="bottom", fontsize=size, color=fg,
                    rotation=rotation)


MAX_SLIDE_ROWS = 4  # heads a walk's slide shows, one row each


def slide_heads(walk, heads: list, only: int | None) -> list:
    """The heads a slide of a walk's rows draws: the one asked for, or all of them when they fit
    (each row `.head`, from 1); more is refused in one line naming --head."""
    shown = [h for h in heads if only is None or h.head == only]
    if len(shown) > MAX_SLIDE_ROWS:
        raise MhaError(f"the slide shows at most {MAX_SLIDE_ROWS} heads: pick one with --head "
                       f"(e.g. --head {walk.view.head_name(1)})", quantity="png")
    return shown


def bars(ax, x, heights, width: float, bottom=0.0, color="#21918c", label: str | None = None,
         hatch: str | None = None):
    """Axes.bar's bars, drawn as one collection: Axes.bar adds a patch a bar and updates the
    limits for each (0.7 s of a 36-axes slide's 4 s). `color` one or one a bar; with `hatch`,
    outlines hatched in grey and no fill. Returns the collection (a legend entry when labelled)."""
    import numpy as np
    from matplotlib.collections import PolyCollection

    x, top = np.asarray(x, float), np.asarray(heights, float)
    low = np.broadcast_to(np.asarray(bottom, float), top.shape)
    top = low + top
    left, right = x - width / 2, x + width / 2
    corners = np.stack([np.stack(c, -1) for c in ((left, low), (left, top), (right, top),
                                                 (right, low))], 1)  # (bars, 4, 2)
    drawn = PolyCollection(corners, facecolors="none" if hatch else color, hatch=hatch,
                           edgecolors="#888888" if hatch else "none", linewidths=1 if hatch else 0,
                           label=label)
    drawn.sticky_edges.y.append(0.0)  # as a bar's base: no margin below an axis at 0
    ax.add_collection(drawn)
    return drawn


def _hatch(ax, hidden) -> None:
    """Hatch the cells where `hidden` (a bool matrix) is True."""
    import numpy as np
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path
    from matplotlib.transforms import Affine2D

    cells = [Path.unit_rectangle().transformed(Affine2D().translate(j - 0.5, i - 0.5))
             for i, j in zip(*np.where(hidden))]
    if cells:
        ax.add_patch(PathPatch(Path.make_compound_path(*cells), fill=False, hatch="///",
                               linewidth=0))
