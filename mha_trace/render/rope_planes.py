"""Render `explain --rope-planes`: each key's score as the sum of RoPE's rotation planes."""

import math

import numpy as np
from rich.text import Text

from mha_trace.analyses.rope_planes import RopePlanes, shown_keys, wavelength
from mha_trace.io.output import new_table
from mha_trace.io.units import turn_text
from mha_trace.records import data, renderables
from mha_trace.render.matrices import fmt

def planes_renderables(t: RopePlanes, decimals: int, only: int | None) -> list:
    w = t.walk
    half = len(t.frequencies)
    out = [Text(f"{w.view.through(w.token, only, w.position)}, each score split by RoPE's "
                f"{half} rotation plane{'s' if half > 1 else ''}", style="bold"),
           Text(f"Plane i turns dims i and i + {2 * half // 2} of q and k together by position · θ_i, "
                f"θ_i = {t.base:g}^(−2i/d_k): the score is the sum of the planes' parts, each "
                f"turned by the query-key distance Δ · θ_i. Every head turns every plane; the "
                f"frequency belongs to a pair of dims, not to a head, and a head can only lean on "
                f"some planes more than others (the shares below).")]
    for h in (h for h in t.heads if only is None or h.head == only):
        keys = shown_keys(t, h)
        table = new_table(f"Head {w.view.head_name(h.head)}")
        for name, justify in (("plane", "right"), ("θ", "right"), ("turn", "right")):
            table.add_column(name, justify=justify)
        for j in keys:
            table.add_column(f"{t.tokens[j]} Δ{t.distances[j]}", justify="right", overflow="fold")
        for i, theta in enumerate(t.frequencies):
            table.add_row(str(i), f"{theta:.3g}", turn_text(theta),
                          *(fmt(h.parts[i, j], decimals) for j in keys))
        table.add_row("score", "", "", *(fmt(h.scores[j], decimals) for j in keys), style="bold",
                      end_section=True)
        table.add_row("unturned", "", "", *(fmt(h.unturned[:, j].sum(), decimals) for j in keys))
        out += [table, Text(_shares(t, h, keys))]
    out.append(Text("θ in radians per token; turn: tokens for one full turn (2π/θ). Each column is "
                    "a key the query sees (its heaviest, when there are more), Δ its distance; "
                    "score = the sum of the planes (q·k ÷ √d_k, as turned); unturned: the same "
                    "q and k before RoPE."))
    return out


def _shares(t: RopePlanes, h, keys: list) -> str:
    """How the head's |parts| over its keys divide between the fast and the slow half of planes."""
    size = np.abs(h.parts[:, keys]).sum(axis=1)
    total = size.sum() or 1.0
    half = max(len(size) // 2, 1)
    fast, top = size[:half].sum() / total, int(np.argmax(size))
    return (f"The faster half of the planes (0–{half - 1}) carries {fast:.0%} of Σ|part| over these "
            f"keys, the slower half {1 - fast:.0%}; the largest is plane {top} (one turn every "
            f"{turn_text(t.frequencies[top])} tokens).")


def planes_data(t: RopePlanes, decimals: int, only: int | None) -> dict:
    r = lambda x: round(float(x), decimals)
    w = t.walk
    return {"command": "explain", "rope_planes": True, "token": w.token, "position": w.position,
            "rope_base": t.base, "tokens": list(t.tokens),
            "planes": [{"plane": i, "dims": [i, i + len(t.frequencies)], "theta": float(theta),
                        "wavelength": wavelength(theta)} for i, theta in enumerate(t.frequencies)],
            "distances": [int(d) for d in t.distances],
            "heads": [{"head": w.view.head_name(h.head),
                       "parts": [[r(x) for x in row] for row in h.parts],
                       "unturned": [[r(x) for x in row] for row in h.unturned],
                       "scores": [r(x) for x in h.scores], "weights": [r(x) for x in h.weights],
                       "masked": h.masked,
                       "angles": [[r(math.fmod(d * theta, 2 * math.pi)) for d in t.distances]
                                  for theta in t.frequencies]}
                      for h in t.heads if only is None or h.head == only]}


@renderables.register(RopePlanes)
def _planes(t, width: int, decimals: int = 4, head: int | None = None, **_) -> list:
    return planes_renderables(t, decimals, head or t.walk.only)


@data.register(RopePlanes)
def _planes_data(t, decimals: int = 4, head: int | None = None, **_) -> dict:
    return planes_data(t, decimals, head or t.walk.only)


import mha_trace.render.rope_slide  # noqa: E402,F401 (registers the slide of what this file shows)
