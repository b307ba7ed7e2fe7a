"""What every slide test checks of a slide's layout, drawn and measured (not looked at by eye)."""

import numpy as np
from matplotlib.text import Text


EDGE = 4  # px: what a person sees as text touching the slide's edge


def laid_out(fig) -> np.ndarray:
    """Draw `fig` and check its layout as a person sees it: every panel and text on the slide,
    no text within EDGE px of its edge; no text over another text (a mark's label over its
    neighbour's), nor over a panel other than its own (a value written in its own cell or above
    its own bar is inside it); no panel over another; no panel's title wider than its panel.
    Returns every box, [x0, y0, x1, y1] in px."""
    fig.canvas.draw()
    box = lambda artist: (Text.get_window_extent(artist) if isinstance(artist, Text)  # a label's
                          else artist.get_window_extent()).extents  # text, not the line to its mark
    boxes, texts = [], []  # (axes, box): every panel and the colour bar; (axes, box): its texts
    for i, ax in enumerate(a for a in fig.axes if a.axison):
        boxes.append((i, box(ax)))
        labels = [ax.title, ax._left_title, ax._right_title, ax.xaxis.label, ax.yaxis.label,
                  *drawn(ax.xaxis), *drawn(ax.yaxis), *ax.texts]
        texts += [(i, box(t)) for t in labels if t.get_visible() and t.get_text()]
        for title in (ax.title, ax._left_title, ax._right_title):
            assert not title.get_text() or np.ptp(box(title)[::2]) <= np.ptp(box(ax)[::2]) + 2, \
                f"the title {title.get_text()!r} is wider than its panel"
    figure_texts = [*fig.texts, *(t for lg in fig.legends for t in lg.get_texts())]  # the title too
    texts += [(-1, box(t)) for t in figure_texts if t is not None and t.get_visible() and t.get_text()]
    for _, (x0, y0, x1, y1) in boxes:
        assert 0 <= x0 and x1 <= 1920 and 0 <= y0 and y1 <= 1080
    for _, (x0, y0, x1, y1) in texts:
        assert EDGE <= x0 and x1 <= 1920 - EDGE and EDGE <= y0 and y1 <= 1080 - EDGE, \
            f"a text at {(x0, y0, x1, y1)} touches or passes the slide's edge"
    over = lambda a, b: a[0] < b[2] - 1 and b[0] < a[2] - 1 and a[1] < b[3] - 1 and b[1] < a[3] - 1
    for i, a in boxes:
        assert not [j for j, b in boxes + texts if j != i and over(a, b)]
    for k, (i, a) in enumerate(texts):
        assert not [j for m, (j, b) in enumerate(texts) if m != k and over(a, b)], (i, a)
    return np.array([b for _, b in boxes + texts])


def drawn(axis) -> list:
    """The tick labels an axis draws: those of its ticks inside its view (the locator's list
    holds one past each end, never drawn)."""
    lo, hi = sorted(axis.get_view_interval())
    return [label for at, label in zip(axis.get_ticklocs(), axis.get_ticklabels())
            if lo - 1e-9 * (hi - lo) <= at <= hi + 1e-9 * (hi - lo)]
