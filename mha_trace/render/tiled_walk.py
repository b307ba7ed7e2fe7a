"""Render `explain --impl tiled`: one query row through FlashAttention-2's loop, tile by tile."""

import math

from rich.text import Text

from mha_trace.analyses.tiled_walk import TiledWalk
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables
from mha_trace.render.matrices import fmt, vector


def _n(x: float, decimals: int) -> str:
    return "−inf" if x == -math.inf else fmt(x, decimals)


def tiled_renderables(t: TiledWalk, decimals: int, only: int | None) -> list:
    w = t.walk
    out = [Text(f"{w.view.through(w.token, only, w.position)}, the tiled way (FlashAttention-2's "
                f"loop): keys in tiles of {t.block_k}", style="bold"),
           Text("For each key tile: m = max(m_old, the tile's scores); rescale = exp(m_old − m) "
                "shrinks what was summed so far; p = exp(score − m); ℓ = rescale · ℓ_old + Σ p; "
                "o = rescale · o_old + Σ p · v. After the last tile the output is o ÷ ℓ, and L = m "
                "+ log ℓ is kept for the backward pass. No row of weights is ever stored.")]
    for h in (h for h in t.heads if only is None or h.head == only):
        table = new_table(f"Head {w.view.head_name(h.head)}")
        for name in ("tile", "key", "s = q·k÷√d_k", "p = exp(s−m)", "m", "rescale", "ℓ",
                     "o (not ÷ ℓ)"):
            table.add_column(name, justify="left" if name in ("tile", "key", "o (not ÷ ℓ)") else "right",
                             no_wrap=name == "o (not ÷ ℓ)")
        for i, tile in enumerate(h.tiles, 1):
            for k, (key, score, p) in enumerate(zip(tile.keys, tile.scores, tile.p)):
                last = k == len(tile.keys) - 1
                table.add_row(str(i) if k == 0 else "", key, _n(score, decimals), fmt(p, decimals),
                              *((_n(tile.m_new, decimals), fmt(tile.rescale, decimals),
                                 fmt(tile.l_new, decimals), _brief(tile.o, decimals))
                                if last else ("", "", "", "")),
                              end_section=last)
        out += [table, Text(_ending(h, decimals))]
    return out


def _brief(values, decimals: int) -> str:
    """A head's vector in a table cell: all of a small one, the first 3 of a big one."""
    if len(values) <= 4:
        return vector(values, decimals)
    return "[" + ", ".join(fmt(x, decimals) for x in values[:3]) + f", … {len(values) - 3} more]"


def _ending(h, decimals: int) -> str:
    diff = float(abs(h.output - h.explicit).max())
    last = h.tiles[-1]
    lse = (f"L = m + log ℓ = {_n(last.m_new, decimals)} + log {fmt(last.l_new, decimals)} = "
           f"{_n(h.lse, decimals)}" if last.l_new else "L = −inf (the query may see no key)")
    return (f"o ÷ ℓ = {vector(h.output, decimals, 8)}; softmax(scores) · V at once: "
            f"{vector(h.explicit, decimals, 8)} (max |diff| {diff:.1e}). {lse}; log Σ exp(score) "
            f"at once: {_n(h.reference_lse, decimals)}.")


def tiled_data(t: TiledWalk, decimals: int, only: int | None) -> dict:
    r = lambda x: None if x == -math.inf else round(float(x), decimals)  # JSON has no -inf: null
    w = t.walk
    return {"command": "explain", "impl": "tiled", "token": w.token, "position": w.position,
            "block_k": t.block_k, "sqrt_d_k": round(w.sqrt_dk, decimals),
            "heads": [{"head": h.head,
                       "tiles": [{"keys": tile.keys, "scores": [r(s) for s in tile.scores],
                                  "m_old": r(tile.m_old), "m_new": r(tile.m_new),
                                  "rescale": r(tile.rescale), "p": [r(p) for p in tile.p],
                                  "l_old": r(tile.l_old), "l_new": r(tile.l_new),
                                  "o": [r(x) for x in tile.o]} for tile in h.tiles],
                       "output": [r(x) for x in h.output], "explicit": [r(x) for x in h.explicit],
                       "logsumexp": r(h.lse), "reference_logsumexp": r(h.reference_lse)}
                      for h in t.heads if only is None or h.head == only]}


@renderables.register(TiledWalk)
def _tiled(t, width: int, decimals: int = 4, head: int | None = None, **_) -> list:
    return tiled_renderables(t, decimals, head or t.walk.only)


@data.register(TiledWalk)
def _tiled_data(t, decimals: int = 4, head: int | None = None, **_) -> dict:
    return tiled_data(t, decimals, head or t.walk.only)


import mha_trace.render.tiled_slide  # noqa: E402,F401 (registers the slide of what this file shows)
import mha_trace.render.page  # noqa: E402,F401 (registers the page of what this file shows)
