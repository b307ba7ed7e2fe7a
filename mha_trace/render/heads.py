"""Render `heads`: each head's weight matrix, the average, the output, whatever the source (the
lecture's module, the user's module, a pretrained model's layers)."""

from rich.text import Text

from mha_trace.analyses.analysis import LectureHeads, ModuleHeads
from mha_trace.records import data, renderables

from mha_trace.render.matrices import (matrix_table, rounded, weights_table, config_data,
                                       describe, head_entry, head_title, heads_json, legend,
                                       sharing_table, EFFECT_NOTE, with_effect_tables)
from mha_trace.render.side_by_side import side_by_side


@renderables.register(LectureHeads)
def _heads(view, width: int, decimals: int = 4, head: int | None = None, concat: bool = True,
           **_) -> list:
    return heads_renderables(view, decimals, head or view.only, concat)


@renderables.register(ModuleHeads)
def _module_heads(view, width: int, decimals: int = 4, head: int | None = None, **_) -> list:
    return module_heads_renderables(view, decimals, head or view.only)


@data.register(LectureHeads)
def _heads_data(view, decimals: int = 4, head: int | None = None, **_) -> dict:
    return heads_data(view, decimals, head or view.only)


@data.register(ModuleHeads)
def _module_heads_data(view, decimals: int = 4, head: int | None = None, **_) -> dict:
    return module_heads_data(view, decimals, head or view.only)


def heads_renderables(view, decimals: int, only_head: int | None, concat: bool = True) -> list:
    """Every head's weights, their average, the concatenation and the output; with one head
    asked for, that head alone (the concatenation and output when `concat`)."""
    c = view.config
    out = [Text(f"{c.title}  ({describe(view)})", style="bold")]
    heads = [only_head - 1] if only_head else range(view.heads)
    tables = [weights_table(head_title(view, h), view.tokens, view.weights[h], view.mask, decimals)
              for h in heads]
    out.append(side_by_side(with_effect_tables(view, tables, list(heads), decimals)))
    if view.effect is not None:
        out.append(Text(EFFECT_NOTE))
    if view.kv_heads != view.heads:
        out.append(sharing_table(view))
    after = []
    if not only_head and view.heads > 1:
        after.append(weights_table("Average over heads (what one averaged map shows)",
                                   view.tokens, view.weights.mean(0), view.mask, decimals))
    if only_head and not concat:
        return out + [legend(view), Text(f"The concatenation of all {view.heads} heads and the "
                                     f"output after W_O: --concat.", style="dim")]
    if view.wo_identity:
        after.append(matrix_table("Output = heads concatenated (W_O = identity)",
                                  view.tokens, view.output, decimals))
    else:
        after += [matrix_table("Concatenation of the heads (before W_O)", view.tokens,
                               view.concat, decimals),
                  matrix_table("Output = concatenation @ W_O (W_O mixes the heads)", view.tokens,
                               view.output, decimals)]
    return out + [side_by_side(after), legend(view)]


def heads_data(view, decimals: int, only_head: int | None) -> dict:
    c, heads = view.config, [only_head - 1] if only_head else range(view.heads)
    source = {"kind": "config", **{k: v for k, v in config_data(view).items() if k not in SETTINGS},
              "concat": rounded(view.concat, decimals), "W_O_identity": view.wo_identity}
    settings = {"layers": 1, "heads": c.heads, "kv_heads": view.kv_heads, "d_model": c.d_model,
                "d_k": c.d_k, "mask": c.mask, "pad": c.pad, "window": c.window, "rope": c.rope,
                "rope_base": c.rope_base, **c.scoring.module_options()}
    return heads_json(source, settings, view.tokens, view.mask,
                      [{**head_entry(1, h + 1, view.kv_head_of(h) + 1, view.weights[h], decimals,
                                     None if view.effect is None else view.effect[0][h]),
                        "dims": [h * view.d_k, (h + 1) * view.d_k]} for h in heads],
                      view.weights.mean(0), view.output, decimals)


SETTINGS = ("d_model", "heads", "kv_heads", "d_k", "mask", "pad", "rope", "rope_base", "window", "qk_norm",
            "softcap", "sinks")


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
    source = {"kind": "module", "module": m.label, "call": m.call, "fed": m.how,
              "averaged": m.averaged}
    settings = {"layers": 1, "heads": None if m.averaged else len(m.weights), "kv_heads": None,
                "d_model": int(m.output.shape[-1]), "d_k": None,
                "mask": "none" if m.mask is None else "given", "pad": None, "window": None,
                "rope": None, "rope_base": None}
    average = None if m.averaged else m.weights.mean(0)
    return heads_json(source, settings, m.tokens, m.mask,
                      [head_entry(1, h + 1, None, m.weights[h], decimals) for h in heads],
                      average, m.output, decimals)


import mha_trace.render.heads_slide  # noqa: E402,F401 (registers the slide of what this file shows)
import mha_trace.render.page  # noqa: E402,F401 (registers the page of what this file shows)
