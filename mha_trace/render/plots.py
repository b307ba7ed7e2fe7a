"""What every slide shares, with matplotlib (an optional extra, imported only for --png).

Made to be read from the back of a room: every picture is one 1920×1080 slide, labels of at least
18 px, a light or a dark theme (slides are usually white), written only once every file of a set is
made. The heatmap slides are in `heatmaps`, the others beside the records they draw.
"""

import contextlib
import os

from mha_trace import speedups
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
        with speedups.artists_without_set_docs():
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
    """The figure as PNG bytes, the figure closed. An axis label left empty is not placed (placing
    one measures every tick label of its axis: 0.03 s of a 36-axes slide), and zlib's fastest
    level writes the same pixels 0.03 s sooner, in a file 7-25% larger."""
    import io

    for axis in (axis for ax in fig.axes for axis in (ax.xaxis, ax.yaxis)):
        if not axis.label.get_text():
            axis.set_label_coords(0, 0)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format="png", dpi=DPI, facecolor=bg, metadata={"Software": None},
                    pil_kwargs={"compress_level": 1})
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


EDGE_PX = 24  # px a slide's title keeps from each side (one that touched the edge was cut there)


def _fitted(title: str, limit: int, points: float | None = None) -> str:
    """A title that fits across the slide (a long sentence is cut, with an ellipsis): at most
    `limit` characters and, at `points`, within the slide's width as drawn (wide letters take
    more room than a count of characters allows)."""
    title = title if len(title) <= limit else title[:limit - 1].rstrip() + "…"
    while points and len(title) > 1 and text_px([title], points)[0] > WIDTH_PX - 2 * EDGE_PX:
        title = title[:-2].rstrip() + "…"
    return title


LABEL_CHARS = 24  # the longest token a slide writes as a label: a config's 200-character token
#                   would leave a slide's panels no room


def token_label(token: str) -> str:
    """A token as a slide's tick label: past LABEL_CHARS characters, cut with an ellipsis."""
    return _fitted(token, LABEL_CHARS)


def text_px(texts: list, points: float) -> tuple[float, float]:
    """The widest of `texts` and a line's height, in px, at `points` in the slide's font,
    measured by matplotlib's own text layout (not guessed from a count of characters)."""
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import text_to_path

    font = FontProperties(size=points)
    size = lambda text: text_to_path.get_text_width_height_descent(text, font, ismath=False)
    return (max((size(t)[0] for t in texts), default=0.0) * DPI / 72,
            sum(size("Xg")[1:]) * DPI / 72)


SLIDE_W, SLIDE_H = WIDTH_PX, HEIGHT_PX - 140  # the title takes the top of the slide
MIN_TICK_PT = 13  # 18 px at 100 dpi: the smallest label readable from the back of a hall


def _ticks(n: int, room_px: float) -> tuple[list[int], float]:
    """Which of n labels to write along room_px pixels, and their size in points: every label
    when each gets MIN_TICK_PT, else every k-th, never below it."""
    size = min(18.0, room_px / max(n, 1) / 1.3 * 72 / DPI)
    step = 1 if size >= MIN_TICK_PT else -(-n // int(room_px / (MIN_TICK_PT * 1.3 * DPI / 72)))
    return list(range(0, n, step)), max(size, MIN_TICK_PT)


def rows_layout(names: list, keys: list, size: float, legend_rows: int = 1,
                wspace: float = 0.16) -> dict:
    """The grid of a slide with a row per head (the walk's, the why's), placed from what it
    holds, as GridSpec's keywords (constrained layout measured every axes: 2 s of a 36-axes
    slide's 5): room on the left for the rows' `names` ("head 6.12") and the values, below for
    the longest of the `keys` written at `size` points (rotated) and `legend_rows` of the
    legend, above for the titles."""
    left = (text_px(names, 18)[0] + text_px(["-00.00"], MIN_TICK_PT)[0] + 36) / WIDTH_PX
    legend = (1.5 * legend_rows + 0.7) * 16 * DPI / 72
    bottom = (text_px(keys, size)[0] + legend + 16) / HEIGHT_PX
    return {"left": left, "right": 0.99, "top": 1 - 96 / HEIGHT_PX, "bottom": bottom,
            "wspace": wspace, "hspace": 0.45 if len(names) > 4 else 0.3}


TICK_PAD = 7.0 * DPI / 72  # px: a tick and the pad before its label (matplotlib's 3.5 + 3.5 pt)
BAR_ROOM = 40, 36  # px: the gap before a colour bar, and its width


def framed(left: float, right: float, top: float, bottom: float, cols: int = 1,
           gap: float = 0.0, rows: int = 1, **grid) -> dict:
    """GridSpec's keywords for a grid of `rows` × `cols` axes with these margins and `gap` between
    axes (across and down), in px: room a slide measured for its labels, so no layout engine
    draws it to find out."""
    width, height = WIDTH_PX - left - right, HEIGHT_PX - top - bottom
    return {"left": left / WIDTH_PX, "right": 1 - right / WIDTH_PX, "top": 1 - top / HEIGHT_PX,
            "bottom": bottom / HEIGHT_PX, "wspace": gap * cols / (width - gap * (cols - 1)),
            "hspace": gap * rows / (height - gap * (rows - 1)), **grid}


def heading(points: float, lines: int = 1, title: float | None = None) -> float:
    """px above the axes: the slide's title (`lines` at `points`) and the axes' own `title`."""
    axes = text_px([], title)[1] + 6 * DPI / 72 if title else 0.0
    return 0.02 * HEIGHT_PX + lines * text_px([], points)[1] + 8 + axes


def bar_beside(fig, image, right: float, label: str, points: float = 18):
    """A colour bar for `image` in the `right` px a slide left for it (colour_bar_room), as tall
    as 80% of the first axes and centred on it; its values at MIN_TICK_PT, `label` beside."""
    box = fig.axes[0].get_position()
    tall = 0.8 * box.height
    bar = fig.colorbar(image, cax=fig.add_axes([1 - (right - BAR_ROOM[0]) / WIDTH_PX,
                                                 box.y0 + (box.height - tall) / 2,
                                                 BAR_ROOM[1] / WIDTH_PX, tall]))
    bar.set_label(label, fontsize=points)
    bar.ax.tick_params(labelsize=MIN_TICK_PT)
    return bar


def colour_bar_room(values: list, points: float = 18) -> float:
    """px on the right for a colour bar whose values read like `values` and its label's line."""
    return sum(BAR_ROOM) + TICK_PAD + text_px(values, MIN_TICK_PT)[0] + text_px([], points)[1] + 16


def few_ticks(ax) -> None:
    """At most 3 values on a row's axis, and no closer than a label's height and a gap (22 px):
    one on a row of 12 heads, whose axes are 45 px tall (its place in the grid must be set)."""
    bins = max(1, min(3, int(ax.get_window_extent().height // 22)))
    ax.locator_params(axis="y", nbins=bins, min_n_ticks=1 if bins < 3 else 2)


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


