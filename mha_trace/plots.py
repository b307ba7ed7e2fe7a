"""PNG heatmaps for slides, with matplotlib (an optional extra, imported only for --png).

Made to be read from the back of a room at 1920×1080: at most four heads per row, axes labelled
query and key, large type, one colour scale per figure with its colour bar (the viridis ramp the
terminal uses), masked cells hatched, and a light or a dark theme (slides are usually white).
"""

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


def save_heatmaps(path: str, title: str, panels: list, decimals: int = 4, theme: str = "light") -> None:
    """panels: (title, row labels, column labels, matrix, mask or None), four to a row.

    One figure of 1920 px wide (taller when there are more rows of panels); every cell carries its
    value when the matrix is small enough to read it, masked cells are hatched.
    """
    plt = _pyplot()
    import io

    import numpy as np

    from mha_trace.files import write_atomic

    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    values = np.concatenate([np.asarray(m)[np.asarray(k, bool)] if k is not None else np.ravel(m)
                             for _, _, _, m, k in panels])
    lo, hi = float(values.min()), float(values.max())
    hi = hi if hi > lo else lo + 1e-9
    dark = theme == "dark"
    fg, bg = ("white", "#1e1e1e") if dark else ("black", "white")
    height = max(HEIGHT_PX, int(rows * WIDTH_PX / cols * 0.95))
    with plt.rc_context({"text.color": fg, "axes.labelcolor": fg, "xtick.color": fg,
                         "ytick.color": fg, "axes.edgecolor": fg, "font.size": 18,
                         "hatch.color": "#888888"}):
        fig, axes = plt.subplots(rows, cols, squeeze=False, figsize=(WIDTH_PX / DPI, height / DPI),
                                 dpi=DPI, facecolor=bg, constrained_layout=True)
        for ax in axes.flat[len(panels):]:
            ax.axis("off")
        image = None
        for ax, (name, row_labels, col_labels, matrix, mask) in zip(axes.flat, panels):
            matrix = np.asarray(matrix, float)
            shown = np.ma.masked_where(~np.asarray(mask, bool), matrix) if mask is not None else matrix
            ax.set_facecolor(bg)
            image = ax.imshow(shown, cmap="viridis", vmin=lo, vmax=hi)
            if mask is not None:  # masked cells: hatched, never a colour that reads as a weight
                for i, j in zip(*np.where(~np.asarray(mask, bool))):
                    ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="///",
                                               linewidth=0))
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
        bar = fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.8)
        bar.set_label(f"attention weight (this figure: {lo:.3g} to {hi:.3g})", fontsize=18)
        fig.suptitle(title, fontsize=28, color=fg)
        buffer = io.BytesIO()
        try:
            fig.savefig(buffer, format="png", dpi=DPI, facecolor=bg, metadata={"Software": None})
        finally:
            plt.close(fig)
    write_atomic(path, buffer.getvalue(), "png")
