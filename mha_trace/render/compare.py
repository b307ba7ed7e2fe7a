"""Render `compare`: the same input split into several head counts, side by side."""

import numpy as np
from rich.text import Text

from mha_trace.analyses.analysis import Comparison
from mha_trace.records import data, renderables
from mha_trace.render.matrices import config_data, legend, matrix_table, rounded, weights_table
from mha_trace.render.side_by_side import side_by_side


def reading(view, first) -> str:
    """One line on what this head count does to the patterns."""
    rows = view.distinct_rows
    T = len(view.tokens)
    parts = [f"d_k = {view.d_k}"]
    if view.d_k == 1:
        parts.append("each score is a product of two single numbers, so a query can only rank "
                     "keys by one coordinate and rows repeat")
    elif view.heads == 1:
        parts.append("one head: a single compromise pattern per query")
    else:
        parts.append(f"{view.heads} heads see {view.heads} different {view.d_k}-dim subspaces")
    parts.append(f"distinct weight rows per head: {', '.join(map(str, rows))} of {T}")
    if first is not view:
        parts.append(f"output moved {np.linalg.norm(view.output - first.output):.4f} (L2) from "
                     f"H = {first.heads}")
    return "; ".join(parts) + "."


def compare_renderables(views, decimals: int) -> list:
    """Each head count as one row of its heads side by side (each table shrinks its decimals
    and labels to share the width before any wraps to a second row), its reading under it, and
    the outputs of every head count side by side at the end."""
    c = views[0].config
    out = [Text(f"{c.title}: the same Q, K, V split into {', '.join(str(v.heads) for v in views)} "
                f"heads", style="bold")]
    for v in views:
        out.append(side_by_side([weights_table(f"H = {v.heads}, head {h + 1}", v.tokens,
                                               v.weights[h], v.mask, decimals)
                                 for h in range(v.heads)], shrink=True))
        out.append(Text(reading(v, views[0])))
    out.append(side_by_side([matrix_table(f"output (H = {v.heads})", v.tokens, v.output,
                                          decimals) for v in views]))
    out.append(legend(views[0]))
    return out


def compare_data(views, decimals: int) -> dict:
    return {"command": "compare", "config": config_data(views[0]), "decimals": decimals,
            "runs": [{"heads": v.heads, "d_k": v.d_k,
                      "weights": [rounded(w, decimals) for w in v.weights],
                      "distinct_rows": v.distinct_rows,
                      "output": rounded(v.output, decimals),
                      "reading": reading(v, views[0])} for v in views]}


@renderables.register(Comparison)
def _comparison(c, width: int, decimals: int = 4, **_) -> list:
    return compare_renderables(c.views, decimals)


@data.register(Comparison)
def _comparison_data(c, decimals: int = 4, **_) -> dict:
    return compare_data(c.views, decimals)


import mha_trace.render.heads_slide  # noqa: E402,F401 (registers the slide of what this file shows)
