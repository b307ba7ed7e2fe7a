"""Render `ablate`: the output with heads removed, and how far each token moved."""

import numpy as np
from rich.text import Text

from mha_trace.output import new_table
from mha_trace.render.matrices import rounded, config_data, describe, fmt, vector
from mha_trace.records import data, renderables
from mha_trace.analysis import Ablation


def ablate_renderables(a, decimals: int) -> list:
    view = a.view
    names = ", ".join(map(str, a.removed))
    out = [Text(f"{view.config.title}: output without head{'s' if len(a.removed) > 1 else ''} "
                f"{names} (zeroed before W_O)  ({describe(view)})", style="bold")]
    table = new_table("Per-token change")
    table.add_column("token", style="bold")
    table.add_column("full output", overflow="fold")
    table.add_column("ablated output", overflow="fold")
    table.add_column("L2 distance", justify="right")
    for t, full, abl, dist in zip(view.tokens, view.output, a.output, a.per_token):
        table.add_row(t, vector(full, decimals, 8), vector(abl, decimals, 8), fmt(dist, decimals))
    out.append(table)
    out.append(Text(f"Total L2 distance: {fmt(a.total, decimals)} "
                    f"({a.relative:.1%} of the full output's norm {fmt(np.linalg.norm(view.output), decimals)})."))
    return out


def ablate_data(a, decimals: int) -> dict:
    return {"command": "ablate", "config": config_data(a.view), "decimals": decimals,
            "removed": a.removed, "full_output": rounded(a.view.output, decimals),
            "output": rounded(a.output, decimals),
            "per_token_l2": [float(x) for x in a.per_token],
            "total_l2": float(a.total), "relative": float(a.relative)}


@renderables.register(Ablation)
def _ablation(a, width: int, decimals: int = 4, **_) -> list:
    return ablate_renderables(a, decimals)


@data.register(Ablation)
def _ablation_data(a, decimals: int = 4, **_) -> dict:
    return ablate_data(a, decimals)
