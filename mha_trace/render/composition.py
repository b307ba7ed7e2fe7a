"""Render `survey --composition`: the strongest compositions of each kind beside random matrices,
every pair's grid for a small model, and for a trained run whom its induction heads read."""

import numpy as np
from rich.text import Text

from mha_trace.analyses.composition import Composition
from mha_trace.core.composition import KINDS
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables
from mha_trace.core.head import Head

GRID_HEADS = 16  # a model with at most this many heads gets every pair's grid
NAMES = {"Q": "Q-composition (the earlier head's output in the later head's queries)",
         "K": "K-composition (... in its keys: what an induction head needs)",
         "V": "V-composition (... in its values)"}


def _name(head) -> str:
    return Head(*head).name


def composition_renderables(c, top: int) -> list:
    m, base = c.model, float(c.baseline.mean())
    out = [Text(f"survey --composition: {m.name}, {m.layers} layers × {m.heads} heads: how much each "
                f"head reads what each head of an earlier layer writes (Elhage et al. 2021), from "
                f"the weights alone", style="bold"),
           Text(f"Random matrices of the same shapes score {base:.3f} (the mean of "
                f"{len(c.baseline)} draws; 95% of them under {np.percentile(c.baseline, 95):.3f}); "
                f"\"× random\" is a score over that mean.")]
    rows = {kind: c.strongest(kind, top) for kind in KINDS}
    shown = min(len(r) for r in rows.values())
    every = f" (all {shown} of them)" if shown < top else ""
    table = new_table(f"The {shown} strongest pairs of each kind (earlier head → later head){every}")
    table.add_column("#", justify="right")
    for kind in KINDS:
        table.add_column(f"{kind}-composition", justify="right", no_wrap=True)
    for i in range(shown):
        table.add_row(str(i + 1), *(f"{_name(a)} → {_name(b)} {x:.3f} ({x / base:.1f}×)"
                                    for a, b, x in (rows[kind][i] for kind in KINDS)))
    out.append(table)
    if len(c.heads) <= GRID_HEADS:
        out += [_grid(c, kind) for kind in KINDS]
    out.append(Text("\n".join(circuit_lines(c) + [
        "The norm a layer reads through is folded into its W_Q, W_K, W_V; RoPE turns q and k by "
        "position and is left out. --format json has every pair."])))
    return out


def _grid(c, kind: str):
    readers = [h for h in c.heads if h[0] > 1]
    writers = [h for h in c.heads if h[0] < c.model.layers]
    grid = new_table(NAMES[kind] + ": rows write, columns read")
    grid.add_column("", style="bold")
    for r in readers:
        grid.add_column(_name(r), justify="right")
    for w in writers:
        cells = [c.scores[kind][c.heads.index(w), c.heads.index(r)] for r in readers]
        grid.add_row(_name(w), *("·" if np.isnan(x) else f"{x:.3f}" for x in cells))
    return grid


def circuit_lines(c) -> list[str]:
    """A trained run: each induction head's strongest K-composition partner, and whether it is a
    previous-token head, from the probe's scores."""
    if not c.roles:
        return []
    induction, previous = c.with_role("induction"), c.with_role("previous token")
    if not induction:
        return ["No head gives over half its weight to the token after an earlier copy on the "
                "run's probe: no induction head to trace."]
    base, lines = float(c.baseline.mean()), []
    for head in induction:
        partner, score = c.partner("K", head)
        is_previous = (f"a previous-token head ({c.roles['previous token'][partner[0] - 1, partner[1] - 1]:.2f} on the probe)"
                       if partner in previous else "not a previous-token head")
        lines.append(f"Induction head {_name(head)} ({c.roles['induction'][head[0] - 1, head[1] - 1]:.2f} "
                     f"on the probe) reads most, in its keys, from {_name(partner)}: K-composition "
                     f"{score:.3f} ({score / base:.1f}× random), {is_previous}.")
    return lines


def composition_data(c) -> dict:
    grid = lambda a: [[None if np.isnan(x) else round(float(x), 6) for x in row] for row in a]
    return {"command": "survey", "composition": True, "model": c.model.name,
            "heads": [list(h) for h in c.heads],
            "scores": {kind: grid(c.scores[kind]) for kind in KINDS},
            "random": {"mean": round(float(c.baseline.mean()), 6),
                       "p95": round(float(np.percentile(c.baseline, 95)), 6),
                       "draws": len(c.baseline)},
            "induction_heads": [{"head": list(h), "k_partner": list(c.partner("K", h)[0]),
                                 "k_score": round(c.partner("K", h)[1], 6),
                                 "partner_is_previous_token": c.partner("K", h)[0] in c.with_role("previous token")}
                                for h in c.with_role("induction")]}


@renderables.register(Composition)
def _composition(c, width: int, top: int = 5, **_) -> list:
    return composition_renderables(c, top)


@data.register(Composition)
def _composition_data(c, **_) -> dict:
    return composition_data(c)


import mha_trace.render.composition_slide  # noqa: E402,F401 (registers the slide of what this file shows)
