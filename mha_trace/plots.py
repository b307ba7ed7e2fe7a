"""PNG heatmaps with matplotlib, an optional extra imported only when --png is given."""

from mha_trace.errors import MhaError


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MhaError('--png needs matplotlib (install it with: pip install "mha-trace[plot]")',
                       exit_code=1) from None
    return plt


def save_heatmaps(path: str, title: str, panels: list, decimals: int = 4) -> None:
    """panels: (title, row labels, column labels, matrix, mask or None), drawn side by side.

    Each cell carries its value; masked cells are hatched and labelled "masked".
    """
    plt = _pyplot()
    import numpy as np

    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    first = panels[0][3]
    cell = 0.55 if first.shape[1] <= 6 else 0.45
    fig, axes = plt.subplots(rows, cols, squeeze=False,
                             figsize=(cols * (first.shape[1] * cell + 1.6), rows * (first.shape[0] * cell + 1.8) + 0.6))
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    for ax, (name, row_labels, col_labels, matrix, mask) in zip(axes.flat, panels):
        shown = np.ma.masked_where(~mask, matrix) if mask is not None else matrix
        ax.imshow(shown, cmap="Blues", vmin=0.0, vmax=1.0)
        ax.set_title(name, fontsize=10)
        ax.set_xticks(range(len(col_labels)), col_labels, rotation=45, ha="right", fontsize=8)
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=8)
        size = 7 if matrix.shape[1] <= 6 else 5
        for i in range(matrix.shape[0]):
            for j in range(matrix.shape[1]):
                if mask is not None and not mask[i][j]:
                    ax.text(j, i, "·", ha="center", va="center", fontsize=size, color="grey")
                else:
                    v = matrix[i][j]
                    digits = min(decimals, 4 if matrix.shape[1] <= 6 else 2)
                    ax.text(j, i, f"{v:.{digits}f}", ha="center", va="center",
                            fontsize=size, color="white" if v > 0.5 else "black")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    import io

    from mha_trace.files import write_atomic

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=150, metadata={"Software": None})
    finally:
        plt.close(fig)
    write_atomic(path, buffer.getvalue(), "png")
