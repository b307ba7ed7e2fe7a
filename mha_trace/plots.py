"""PNG heatmaps for slides, with matplotlib (an optional extra, imported only for --png).

Made to be read from the back of a room at 1920×1080: at most four heads per row, axes labelled
query and key, large type, one colour scale per figure with its colour bar (the viridis ramp the
terminal uses), masked cells hatched, and a light or a dark theme (slides are usually white).
"""

import contextlib
import os

from mha_trace.errors import MhaError

WIDTH_PX, HEIGHT_PX, DPI = 1920, 1080, 100


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MhaError('--png needs matplotlib (install it with: pip install matplotlib, or from a '
                       'clone: pip install ".[plot]")', exit_code=1) from None
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
    from mha_trace.files import write_atomic

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


def _save(plt, fig, path: str, bg: str) -> None:
    import io

    from mha_trace.files import write_atomic

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=DPI, facecolor=bg, metadata={"Software": None})
    finally:
        plt.close(fig)
    if _together is not None:
        _together.append((path, buffer.getvalue()))
    else:
        write_atomic(path, buffer.getvalue(), "png")


def _fitted(title: str, limit: int) -> str:
    """A title that fits across the slide (a long sentence is cut, with an ellipsis)."""
    return title if len(title) <= limit else title[:limit - 1].rstrip() + "…"


def layer_paths(path: str, layers: int) -> list[str]:
    """The per-layer files beside a model's overview: heads.png -> heads-layer01.png, ..."""
    stem = path[:-len(".png")]
    return [f"{stem}-layer{l:0{len(str(layers))}d}.png" for l in range(1, layers + 1)]


def save_model(path: str, title: str, tokens: list, weights, causal: bool,
               decimals: int = 4, theme: str = "light", on_figure=lambda: None) -> list[str]:
    """A model's heads for slides: `path` gets the overview grid (every layer.head as a small
    tile on one colour scale), and one figure per layer goes beside it (layer_paths), all
    written at the end (`on_figure()` after each is made). Returns the files, the overview first."""
    import numpy as np

    from mha_trace.masks import allowed

    w = np.asarray(weights, float)
    L, H, T, _ = w.shape
    mask = allowed(T, "causal") if causal else None
    paths = layer_paths(path, L)
    with written_together():
        for l, layer_path in enumerate(paths):
            save_heatmaps(layer_path, f"{title}, layer {l + 1}",
                          [(f"head {l + 1}.{h + 1}", tokens, tokens, w[l, h], mask)
                           for h in range(H)], decimals, theme)
            on_figure()
        save_overview(path, title, w, mask, theme)
    return [path, *paths]


def save_overview(path: str, title: str, w, mask, theme: str) -> None:
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
        lo, hi = float(np.nanmin(mosaic)), float(np.nanmax(mosaic))
        image = ax.imshow(mosaic, cmap=cmap, interpolation="nearest", aspect="auto", vmin=lo,
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
        bar.set_label(f"attention weight ({lo:.2f} to {hi:.2f})", fontsize=18)
        fig.suptitle(f"{_fitted(title, 110)}\nevery head: {L} layers × {H} heads", fontsize=24,
                     color=fg)
    _save(plt, fig, path, bg)


def save_heatmaps(path: str, title: str, panels: list, decimals: int = 4, theme: str = "light") -> None:
    """panels: (title, row labels, column labels, matrix, mask or None), four to a row.

    One figure of 1920 px wide (taller when there are more rows of panels); every cell carries its
    value when the matrix is small enough to read it, masked cells are hatched.
    """
    plt = _pyplot()
    import numpy as np

    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    values = np.concatenate([np.asarray(m)[np.asarray(k, bool)] if k is not None else np.ravel(m)
                             for _, _, _, m, k in panels])
    lo, hi = float(values.min()), float(values.max())
    hi = hi if hi > lo else lo + 1e-9
    fg, bg = _theme(theme)
    height = max(HEIGHT_PX, int(rows * WIDTH_PX / cols * 0.95))
    with plt.rc_context(_rc(fg)):
        fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(WIDTH_PX / DPI, height / DPI),
                                 dpi=DPI, facecolor=bg, constrained_layout=True)
        for ax in axes.flat[len(panels):]:
            ax.axis("off")
        images = [_panel(ax, panel, lo, hi, decimals, fg, bg) for ax, panel in zip(axes.flat, panels)]
        bar = fig.colorbar(images[-1], ax=axes.ravel().tolist(), shrink=0.8)
        bar.set_label(f"attention weight (this figure: {lo:.2f} to {hi:.2f})", fontsize=18)
        fig.suptitle(_fitted(title, 95), fontsize=28, color=fg)
    _save(plt, fig, path, bg)


def _panel(ax, panel, lo: float, hi: float, decimals: int, fg: str, bg: str):
    """One heatmap on `ax`: (title, row labels, column labels, matrix, mask or None); masked
    cells hatched, values written in when there are at most 8 columns. Returns the image."""
    import numpy as np

    name, row_labels, col_labels, matrix, mask = panel
    matrix = np.asarray(matrix, float)
    shown = np.ma.masked_where(~np.asarray(mask, bool), matrix) if mask is not None else matrix
    ax.set_facecolor(bg)
    image = ax.imshow(shown, cmap="viridis", vmin=lo, vmax=hi)
    if mask is not None:  # masked cells: hatched, never a colour that reads as a weight
        _hatch(ax, ~np.asarray(mask, bool))
    ax.set_title(name, fontsize=24, color=fg)
    small = matrix.shape[1] <= 12
    labels = 18 if matrix.shape[1] <= 6 else 14 if small else 11
    ax.set_xticks(range(len(col_labels)), col_labels, rotation=45, ha="right", fontsize=labels)
    ax.set_yticks(range(len(row_labels)), row_labels, fontsize=labels)
    ax.set_xlabel("key", fontsize=20)
    ax.set_ylabel("query", fontsize=20)
    if small and matrix.shape[1] <= 8:
        for i in range(matrix.shape[0]):
            for j in range(matrix.shape[1]):
                if mask is None or mask[i][j]:
                    v = matrix[i][j]
                    light = (v - lo) / (hi - lo) > 0.6
                    ax.text(j, i, f"{v:.{min(decimals, 2)}f}", ha="center", va="center",
                            fontsize=16, color="black" if light else "white")
    return image


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
