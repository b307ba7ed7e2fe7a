"""Render `heads`: each head's weight matrix, the average, the output (and a user module's)."""

from rich.text import Text

from mha_trace.render.matrices import (matrix_table, rounded, weights_table, config_data,
                                       describe, head_title, legend, sharing_table)


def heads_renderables(view, decimals: int, only_head: int | None) -> list:
    c = view.config
    out = [Text(f"{c.title}  ({describe(view)})", style="bold")]
    heads = [only_head - 1] if only_head else range(view.heads)
    for h in heads:
        out.append(weights_table(head_title(view, h), view.tokens, view.weights[h], view.mask,
                                  decimals))
    if view.kv_heads != view.heads:
        out.append(sharing_table(view))
    if not only_head and view.heads > 1:
        out.append(weights_table("Average over heads (what a single averaged map would show)",
                                  view.tokens, view.weights.mean(0), view.mask, decimals))
    if view.wo_identity:
        out.append(matrix_table("Output = concatenation of the heads (W_O is the identity)",
                                 view.tokens, view.output, decimals))
    else:
        out.append(matrix_table("Concatenation of the heads (before W_O)", view.tokens,
                                 view.concat, decimals))
        out.append(matrix_table("Output = concatenation @ W_O (W_O mixes the heads)",
                                 view.tokens, view.output, decimals))
    out.append(legend())
    return out


def heads_data(view, decimals: int, only_head: int | None) -> dict:
    heads = [only_head - 1] if only_head else range(view.heads)
    return {
        "command": "heads",
        "config": config_data(view),
        "decimals": decimals,
        "mask": None if view.mask is None else view.mask.tolist(),
        "heads": [{"head": h + 1, "dims": [h * view.d_k, (h + 1) * view.d_k],
                   "kv_head": view.kv_head_of(h) + 1,
                   "weights": rounded(view.weights[h], decimals)} for h in heads],
        "average": rounded(view.weights.mean(0), decimals),
        "concat": rounded(view.concat, decimals),
        "output": rounded(view.output, decimals),
        "W_O_identity": view.wo_identity,
    }


def module_heads_renderables(m, decimals: int, only_head: int | None) -> list:
    out = [Text(f"{m.label}, {m.call}: {' '.join(m.tokens)}  ({m.how})",
                style="bold")]
    if m.averaged:
        out.append(Text("This module returns one weight map averaged over its heads, so per-head "
                        "patterns are not available."))
    heads = [only_head - 1] if only_head else range(len(m.weights))
    for h in heads:
        name = "weights as returned (averaged over heads)" if m.averaged else f"Head {h + 1} of {len(m.weights)}"
        out.append(weights_table(name, m.tokens, m.weights[h], m.mask, decimals))
    out.append(matrix_table("Output", m.tokens, m.output, decimals))
    out.append(legend())
    return out


def module_heads_data(m, decimals: int, only_head: int | None) -> dict:
    heads = [only_head - 1] if only_head else range(len(m.weights))
    return {"command": "heads", "module": m.label, "call": m.call, "fed": m.how,
            "tokens": list(m.tokens),
            "decimals": decimals, "averaged": m.averaged,
            "mask": None if m.mask is None else m.mask.tolist(),
            "heads": [{"head": h + 1, "weights": rounded(m.weights[h], decimals)} for h in heads],
            "output": rounded(m.output, decimals)}
