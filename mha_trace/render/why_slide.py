"""`explain --why --png`: for each head, every key's score as a stack of its sources' parts (up
above zero, down below), the score itself a dot, and the weights beside."""

import numpy as np

from mha_trace.render.plots import (DPI, HEIGHT_PX, MIN_TICK_PT, SLIDE_W, WIDTH_PX, _fitted,
                                    _pyplot, _rc, _save, _theme, _ticks, _weights_on, bars,
                                    few_ticks, rows_layout, token_label)

LEGEND_COLUMNS = 7
COLOURS = ["#3b528b", "#21918c", "#5ec962", "#f58231", "#e6194b", "#911eb4", "#42d4f4", "#9a6324"]


def save_why(path: str, title: str, walk, theme: str = "light") -> None:
    plt = _pyplot()
    fg, bg = _theme(theme)
    keys = [token_label(t) for t in walk.view.tokens]
    with plt.rc_context(_rc(fg)):
        fig, axes = plt.subplots(len(walk.why), 2, squeeze=False, sharex="col",
                                 figsize=(WIDTH_PX / DPI, HEIGHT_PX / DPI), dpi=DPI, facecolor=bg,
                                 gridspec_kw={"width_ratios": [3, 1]})
        colours = _colours(walk.why)
        for (parts_ax, weights_ax), why in zip(axes, walk.why):
            _stack(parts_ax, why, fg, colours)
            bars(weights_ax, np.arange(len(keys)), why.weights(), 0.7)
            if len(walk.why) <= 2 and len(keys) <= 20:  # room for the numbers themselves
                _weights_on(weights_ax, range(len(keys)), why.weights(), fg, 13)
                for x, score in enumerate(why.score):
                    if why.allowed[x]:
                        parts_ax.annotate(f"{score:.2f}", (x, score), textcoords="offset points",
                                          xytext=(0, 9), ha="center", fontsize=13, color=fg)
            parts_ax.set_ylabel(f"head {walk.view.head_name(why.head)}", fontsize=18, rotation=0, ha="right", va="center")
            for ax in (parts_ax, weights_ax):
                ax.set_facecolor(bg)
                ax.axhline(0, color=fg, linewidth=0.8)
                ax.tick_params(labelsize=MIN_TICK_PT)
        axes[0][0].set_title("each source's share of q·k/√d_k: its own term, half of each shared (dot: the score)",
                             fontsize=18, color=fg)
        axes[0][1].set_title("softmax: the weights", fontsize=20, color=fg)
        xs, size = _ticks(len(keys), SLIDE_W * 0.6)
        for ax, (ticks, points) in zip(axes[-1], ((xs, size), _ticks(len(keys), SLIDE_W * 0.2))):
            ax.set_xticks(ticks, [keys[j] for j in ticks], rotation=90, fontsize=points)  # each column's width
        handles = {label: h for ax in axes[:, 0] for h, label in zip(*ax.get_legend_handles_labels())}
        fig.legend(handles.values(), handles.keys(), loc="lower left", bbox_to_anchor=(0.005, 0.0),
                   ncols=min(LEGEND_COLUMNS, len(handles)), fontsize=16, facecolor=bg,
                   labelcolor=fg, frameon=False)
        fig.subplots_adjust(**rows_layout(  # placed from what it holds, not measured by drawing
            [f"head {walk.view.head_name(why.head)}" for why in walk.why], [keys[j] for j in xs],
            size, legend_rows=-(-len(handles) // LEGEND_COLUMNS), wspace=0.08))
        for ax in axes.flat:
            few_ticks(ax)
        fig.suptitle(_fitted(title, 95, 28), fontsize=28, color=fg)
    _save(plt, fig, path, bg)


def _colours(whys: list) -> dict:
    """source -> colour, for the sources that weigh most over every head and key shown (one
    colour a source on the whole slide); the rest are drawn together as "other"."""
    weight = {}
    for why in whys:
        for name, row in zip(why.sources, np.abs(why.parts).sum(1)):
            weight[name] = weight.get(name, 0.0) + float(row)
    order = sorted((n for n in weight if weight[n] > 0), key=lambda n: -weight[n])
    shown = order[:len(COLOURS) - 1] if len(order) > len(COLOURS) else order
    return dict(zip(shown, COLOURS))


def _stack(ax, why, fg: str, colours: dict) -> None:
    """Each key's parts stacked by source, up above zero and down below; the score a dot."""
    parts = why.parts  # (S, T)
    rows = [(name, parts[why.sources.index(name)], c) for name, c in colours.items()
            if name in why.sources]
    rest = [s for s, name in enumerate(why.sources) if name not in colours and parts[s].any()]
    if rest:
        rows.append(("other", parts[rest].sum(0), "#aaaaaa"))
    x = np.arange(parts.shape[1])
    up, down = np.zeros(len(x)), np.zeros(len(x))
    for name, values, colour in rows:
        bars(ax, x, values, 0.7, bottom=np.where(values >= 0, up, down), color=colour, label=name)
        up, down = up + np.maximum(values, 0), down + np.minimum(values, 0)
    ax.plot(x, why.score, "o", color=fg, markersize=8, label="score")
    ax.margins(y=0.1)
