"""The heatmap slides (`heads --png`, `compare --png`, a model's overview and its layers): every
head's weights as one panel, the panels in the grid that gives them the most room, one colour scale
per slide from 0 with its colour bar (the viridis ramp the terminal uses), masked cells hatched.

The panels are placed by a fixed layout computed from what the slide holds (the grid, the
matrices' shape, the labels measured in the font they are drawn in), not by matplotlib's
constrained layout, which drew and measured every axes of every slide (0.3 s a slide: a third of
a 30-layer model's figures).
"""

from mha_trace.core.head import Head
from mha_trace.render.plots import (DPI, HEIGHT_PX, SLIDE_H, SLIDE_W, TICK_PAD, WIDTH_PX, _fitted,
                                    _pyplot, _rc, _save, _theme, _ticks, bar_beside,
                                    colour_bar_room, framed, heading, text_px, token_label,
                                    written_together)

EDGE, GAP, BAR_GAP, BAR_W = 16, 24, 40, 36  # px: the slide's edge, between panels, the colour bar
TICK_PT, PAD_PT, TITLE_PAD_PT = 7.0, 4.0, 6.0  # a tick and its label's pad; an axis name's; a title's


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
                          [(f"head {Head.at(l, h)}", tokens, tokens, w[l, h], mask)
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
    hi = top or float(np.nanmax(mosaic))
    ticks = (18 if cols <= 16 else 12, 18 if rows <= 16 else 12)  # points: across, down
    name = text_px([], 20)[1]
    with plt.rc_context(_rc(fg)):
        fig, ax = plt.subplots(figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, facecolor=bg,
                               gridspec_kw=framed(
                                   EDGE + name + text_px([str(rows)], ticks[1])[0] + TICK_PAD,
                                   colour_bar_room([f"{hi:.2f}"]), heading(24, lines=2),
                                   EDGE + name + text_px([], ticks[0])[1] + TICK_PAD))
        ax.set_facecolor(bg)
        cmap = plt.get_cmap("viridis").with_extremes(bad=bg)
        image = ax.imshow(mosaic, cmap=cmap, interpolation="nearest", aspect="auto", vmin=0.0,
                          vmax=hi)
        centres = [i * (T + gap) + (T - 1) / 2 for i in range(max(rows, cols))]
        row_name, col_name = ("head", "layer") if across else ("layer", "head")
        ax.set_xticks(centres[:cols], [str(i + 1) for i in range(cols)], fontsize=ticks[0])
        ax.set_yticks(centres[:rows], [str(i + 1) for i in range(rows)], fontsize=ticks[1])
        ax.set_xlabel(f"{col_name}  (each tile: queries down, keys across)", fontsize=20)
        ax.set_ylabel(row_name, fontsize=20)
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        blank = ", blank: masked" if mask is not None else ""
        bar_beside(fig, image, colour_bar_room([f"{hi:.2f}"]), f"attention weight (0 to {hi:.2f}{blank})")
        fig.suptitle(f"{_fitted(title, 110, 24)}\nevery head: {L} layers × {H} heads", fontsize=24,
                     color=fg)
    _save(plt, fig, path, bg)


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


def save_heatmaps(path: str, title: str, panels: list, decimals: int = 4, theme: str = "light",
                  cols: int | None = None, top: float | None = None,
                  groups: list | None = None) -> None:
    """panels: (title, row labels, column labels, matrix, mask or None) or None for an empty
    slot, on one 1920×1080 slide in the grid that gives them the most room (or `cols` to a
    row). One colour scale for the slide from 0 (the darkest colour always means no attention)
    to `top`, or to the slide's largest weight; masked cells hatched; values written in when
    the cells are big enough; with `groups` (a K/V head per panel) the panels that share one
    are framed alike."""
    plt = _pyplot()
    import numpy as np

    rows, cols = grid(len(panels), cols)
    shown = [(name, [*map(token_label, queries)], [*map(token_label, keys)], m, k)
             for name, queries, keys, m, k in filter(None, panels)]
    values = np.concatenate([np.asarray(m)[np.asarray(k, bool)] if k is not None else np.ravel(m)
                             for _, _, _, m, k in shown])
    hi = top or max(float(values.max()), 1e-9)
    lo = min(0.0, float(values.min()))  # below 0 only where a map was taken away (differential)
    shared = len({(tuple(p[1]), tuple(p[2])) for p in shown}) == 1  # one sentence's heads
    room = min(SLIDE_W / cols, SLIDE_H / rows) * (0.85 if shared else 0.7)  # a panel's cells
    ticks = [(*_ticks(len(p[2]), room), *_ticks(len(p[1]), room)) for p in shown]
    shape = tuple(max(np.shape(p[3])[i] for p in shown) for i in (0, 1))
    placed, bar_at, cell = _placed(rows, cols, shape, [
        ([p[1][i] for i in ys], ysize, [p[2][j] for j in xs], xsize)
        for p, (xs, xsize, ys, ysize) in zip(shown, ticks)], shared)
    fg, bg = _theme(theme)
    with plt.rc_context(_rc(fg)):
        fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI),
                                 dpi=DPI, facecolor=bg, gridspec_kw=placed)
        drawn = [ax for ax, panel in zip(axes.flat, panels) if panel]
        for ax in set(axes.flat) - set(drawn):  # a slot left empty
            ax.axis("off")
        edges = _labelled(rows, cols, [bool(p) for p in panels]) if shared else [(True, True)] * len(shown)
        images = [_panel(ax, panel, hi, decimals, fg, bg, tick, cell, edge, lo)
                  for ax, panel, tick, edge in zip(drawn, shown, ticks, edges)]
        if groups:
            _frame_groups(drawn, groups, shown)
        bar = fig.colorbar(images[-1], cax=fig.add_axes(bar_at))
        span = f"{lo:.2f} to {hi:.2f}, below 0: taken away" if lo < 0 else f"0 to {hi:.2f}"
        bar.set_label(f"attention weight ({span}{', fixed' if top else ''})", fontsize=18)
        bar.ax.tick_params(labelsize=16)
        fig.suptitle(_fitted(title, 95, 28), fontsize=28, color=fg)
    _save(plt, fig, path, bg)


def _placed(rows: int, cols: int, shape: tuple, labels: list, shared: bool) -> tuple:
    """(the grid's placement as GridSpec's keywords, the colour bar's [left, bottom, width,
    height], a cell's side in px) for `rows` × `cols` panels of `shape` (queries, keys): every
    panel the same box, shaped like its matrix, as large as the slide allows once the titles,
    the labels (`labels`: each panel's row labels, their points, its column labels, theirs),
    the axis names and the colour bar have their room; the labels at the grid's left and
    bottom edges only when `shared` (one sentence's heads), else at every panel."""
    px = DPI / 72
    name = text_px(["query"], 18)[1]  # an axis name's line ("query" turned, "key")
    left = (TICK_PT + PAD_PT) * px + name + max(text_px(r, rp)[0] for r, rp, _, _ in labels)
    below = (TICK_PT + PAD_PT) * px + name + max(text_px(c, cp)[0] for _, _, c, cp in labels)
    above = text_px([], 22)[1] + TITLE_PAD_PT * px
    bar = BAR_GAP + BAR_W + (TICK_PT + PAD_PT) * px + text_px(["0.00"], 16)[0] + name
    top = 0.02 * HEIGHT_PX + text_px([], 28)[1] + 8  # the slide's title
    gx, gy = GAP + (0 if shared else left), GAP / 2 + above + (0 if shared else below)
    room_w = WIDTH_PX - 2 * EDGE - left - bar - (cols - 1) * gx
    room_h = HEIGHT_PX - top - EDGE - above - below - (rows - 1) * gy
    cell = max(min(room_w / (cols * shape[1]), room_h / (rows * shape[0])), 1.0)
    w, h = cell * shape[1], cell * shape[0]
    x0 = (WIDTH_PX - left - cols * w - (cols - 1) * gx - bar) / 2 + left  # centred
    y0 = top + above + (room_h - rows * h) / 2
    x1, y1 = x0 + cols * w + (cols - 1) * gx, y0 + rows * h + (rows - 1) * gy
    tall = 0.8 * (y1 - y0)
    return ({"left": x0 / WIDTH_PX, "right": x1 / WIDTH_PX, "top": 1 - y0 / HEIGHT_PX,
             "bottom": 1 - y1 / HEIGHT_PX, "wspace": gx / w, "hspace": gy / h},
            [(x1 + BAR_GAP) / WIDTH_PX, 1 - (y0 + y1 + tall) / 2 / HEIGHT_PX, BAR_W / WIDTH_PX,
             tall / HEIGHT_PX], cell)


def _labelled(rows: int, cols: int, filled: list) -> list[tuple[bool, bool]]:
    """Panels with the same tokens: (queries named, keys named) for each filled slot, in order:
    the queries at the first panel of each row only, the keys under the lowest panel of each
    column only, so the cells get the room the labels took (and no panel makes ticks it hides)."""
    at = lambda r, c: r * cols + c < len(filled) and filled[r * cols + c]
    return [(not any(at(r, k) for k in range(c)), not any(at(k, c) for k in range(r + 1, rows)))
            for r in range(rows) for c in range(cols) if at(r, c)]


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


def _panel(ax, panel, hi: float, decimals: int, fg: str, bg: str, ticks: tuple, cell: float,
           edges: tuple = (True, True), lo: float = 0.0):
    """One heatmap on `ax`: (title, row labels, column labels, matrix, mask or None), its queries
    and its keys labelled where `edges` says, at `ticks` (which keys and their points, which
    queries and theirs); masked cells hatched, values written in when a cell (`cell` px) is at
    least 60 px. Returns the image."""
    import numpy as np

    name, row_labels, col_labels, matrix, mask = panel
    matrix = np.asarray(matrix, float)
    shown = np.ma.masked_where(~np.asarray(mask, bool), matrix) if mask is not None else matrix
    ax.set_facecolor(bg)
    image = ax.imshow(shown, cmap="viridis", vmin=lo, vmax=hi)
    if mask is not None:  # masked cells: hatched, never a colour that reads as a weight
        _hatch(ax, ~np.asarray(mask, bool))
    ax.set_title(name, fontsize=22, color=fg)
    xs, xsize, ys, ysize = ticks
    queries, keys = edges
    ax.set_yticks(*(ys, [row_labels[i] for i in ys]) if queries else ([], []), fontsize=ysize)
    ax.set_xticks(*(xs, [col_labels[j] for j in xs]) if keys else ([], []), rotation=90,
                  fontsize=xsize)
    ax.set_ylabel("query" if queries else "", fontsize=18)
    ax.set_xlabel("key" if keys else "", fontsize=18)
    if cell >= 60:
        for i, j in zip(*np.nonzero(np.ones_like(matrix) if mask is None else np.asarray(mask))):
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


def _hatch(ax, hidden) -> None:
    """Hatch the cells where `hidden` (a bool matrix) is True: one path of their squares, added
    as an artist (add_patch would walk every square's edges to update limits the image set)."""
    import numpy as np
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path

    rows, cols = np.nonzero(hidden)
    if len(rows):
        corners = np.array([(-0.5, -0.5), (0.5, -0.5), (0.5, 0.5), (-0.5, 0.5), (-0.5, -0.5)])
        squares = corners[None] + np.stack([cols, rows], -1)[:, None]  # (cells, 5, 2)
        codes = np.tile([Path.MOVETO, *[Path.LINETO] * 3, Path.CLOSEPOLY], len(rows))
        ax.add_artist(PathPatch(Path(squares.reshape(-1, 2), codes), fill=False, hatch="///",
                                linewidth=0))
