"""Render `survey`: the top heads per behaviour, and a layer × head grid per detector."""

import numpy as np
from rich.text import Text

from mha_trace.output import new_table
from mha_trace.render.matrices import shade
from mha_trace.render import data, renderables
from mha_trace.induction import Induction
from mha_trace.model_analysis import Survey


def _top(scores: np.ndarray, n: int) -> list[tuple[int, int, float]]:
    order = np.argsort(-scores, axis=None, kind="stable")[:n]
    return [(int(i // scores.shape[1]) + 1, int(i % scores.shape[1]) + 1, float(scores.flat[i]))
            for i in order]


def _behaviours(result) -> dict:
    found = dict(result.scores)
    if result.probe:
        for target, scores in result.probe["scores"].items():
            found[f"{result.probe['from']} → {target}"] = scores
    return found


def survey_renderables(result, top: int) -> list:
    m = result.model
    where = (f"the built-in set of {len(result.sentences)} sentences" if result.builtin
             else f"\"{result.sentences[0].text}\"")
    out = [Text(f"survey: {m.name}, {m.layers} layers × {m.heads} heads, on {where}",
                style="bold")]
    table = new_table(f"Top {top} heads per behaviour (score: the mean weight a query gives to "
                      f"that key)")
    table.add_column("behaviour", style="bold")
    for k in range(top):
        table.add_column(f"#{k + 1}", justify="right", no_wrap=True)
    for name, scores in _behaviours(result).items():
        table.add_row(name, *(f"{l}.{h} {s:.2f}" for l, h, s in _top(scores, top)))
    out.append(table)
    for name, scores in _behaviours(result).items():
        grid = new_table(f"{name}: every layer × head")
        grid.add_column("layer", justify="right", style="bold")
        for h in range(m.heads):
            grid.add_column(str(h + 1), justify="right", no_wrap=True)
        for layer in range(m.layers):
            grid.add_row(str(layer + 1), *(Text(f"{x:.2f}".lstrip("0") if x < 1 else "1.0",
                                                style=shade(float(x)))
                                           for x in scores[layer]))
        out.append(grid)
    if result.probe:
        used = "; ".join(f"\"{t}\"" for t in result.probe["sentences"])
        out.append(Text(f"Coreference probe: the weight from '{result.probe['from']}' to each "
                        f"candidate, summed over its pieces, in {used}."))
    out.append(Text("\n".join(sink_lines(result))))
    out.append(Text("Scores are means over queries (and sentences): previous/next token and self "
                    "need a key in that place; [CLS] and [SEP] are the first and last tokens; "
                    "punctuation sums every punctuation key."))
    return out


def sink_lines(result) -> list[str]:
    """The share of attention each layer gives its sink tokens, and what the literature reports
    for larger models beside what these numbers show."""
    sinks = result.sinks
    by_layer = lambda v: "  ".join(f"{l + 1}: {x:.2f}" for l, x in enumerate(v))
    lines = [f"Attention on the {name}, by layer: {by_layer(v)}" for name, v in sinks.items()]
    if "first token (sink)" in sinks:
        v = sinks["first token (sink)"]
        rest = v[2:]
        agree = max(v[:2]) < 0.5 < np.median(rest)
        lines.append(f"Xiao et al. 2023 find attention sinks on the first token in every layer of "
                     f"Llama-2 but the first two. {'Here too' if agree else 'Not quite here'}: "
                     f"layers 1-2 give it {v[0]:.2f} and "
                     f"{v[1]:.2f}; the others {np.mean(rest):.2f} on average, and "
                     f"{int((rest > 0.5).sum())} of {len(rest)} give it more than half (least: "
                     f"layer {int(np.argmin(rest)) + 3}, {rest.min():.2f}).")
    elif "last token ([SEP])" in sinks:
        cls, sep = sinks["first token ([CLS])"], sinks["last token ([SEP])"]
        verdict = "Here too" if sep.max() > 0.5 else "Not here"
        lines.append(f"Clark et al. 2019 find BERT-base's middle layers give over half their "
                     f"attention to [SEP]. {verdict}: [SEP] gets at most {sep.max():.2f} in any "
                     f"layer, and [CLS] up to {cls.max():.2f} (layer {int(np.argmax(cls)) + 1}).")
    return lines


def survey_data(result, top: int) -> dict:
    return {"command": "survey", "model": result.model.name,
            "sentences": [s.text for s in result.sentences], "builtin": result.builtin,
            "behaviours": [{"name": name,
                            "top": [{"layer": l, "head": h, "score": round(s, 6)}
                                    for l, h, s in _top(scores, top)],
                            "scores": [[round(float(x), 6) for x in row] for row in scores]}
                           for name, scores in _behaviours(result).items()],
            "sinks_by_layer": {name: [round(float(x), 6) for x in v]
                               for name, v in result.sinks.items()},
            "probe": None if not result.probe else {
                "from": result.probe["from"], "to": result.probe["to"],
                "sentences": result.probe["sentences"]}}


@renderables.register(Survey)
def _survey(result, width: int, top: int = 3, **_) -> list:
    return survey_renderables(result, top)


@data.register(Survey)
def _survey_data(result, top: int = 3, **_) -> dict:
    return survey_data(result, top)


def _below(previous: np.ndarray, layer: int) -> str:
    """The best previous-token head one layer below `layer` (counted from 1), with its score."""
    if layer < 2:
        return "—"
    h = int(np.argmax(previous[layer - 2]))
    return f"{layer - 1}.{h + 1} {previous[layer - 2, h]:.2f}"


def induction_renderables(r, top: int) -> list:
    m, seeds = r.model, ", ".join(map(str, r.seeds))
    out = [Text(f"survey --induction: {m.name}, {r.n} random whole-word tokens repeated twice "
                f"(seeds {seeds}, averaged)", style="bold")]
    table = new_table(f"Top {top} induction heads (score: the mean weight from each repeated "
                      f"token to the token after its earlier copy)")
    table.add_column("head", style="bold", justify="right")
    table.add_column("induction", justify="right")
    table.add_column("previous-token head one layer below", justify="right")
    for layer, head, score in _top(r.induction, top):
        table.add_row(f"{layer}.{head}", Text(f"{score:.3f}", style=shade(score)),
                      _below(r.previous, layer))
    out.append(table)
    chance = 1 / (r.n + 1.5)  # a query in the repeated half sees n + 1 .. 2n keys: ~1/(1.5 n)
    strong = int((r.induction > 0.5).sum())
    lines = [f"{strong} of {r.induction.size} heads score above 0.5; a head that spread its "
             f"weight evenly over the keys it sees would score about {chance:.3f}.",
             f"Next-token loss, nats per token: first half {r.loss_first:.2f}, repeated half "
             f"{r.loss_repeated:.2f} (a uniform guess over the {m.vocab_size:,}-token vocabulary: "
             f"{np.log(m.vocab_size):.2f}). The repeated half is predicted by copying."]
    if r.removed:
        names = ", ".join(f"{l}.{h}" for l, h in r.removed)
        lines.append(f"Without the top {len(r.removed)} induction heads ({names}): repeated half "
                     f"{r.loss_removed:.2f}.")
    out.append(Text("\n".join(lines)))
    return out


def induction_data(r, top: int) -> dict:
    rows = [{"layer": l + 1, "head": h + 1, "induction": round(float(r.induction[l, h]), 6),
             "previous_token": round(float(r.previous[l, h]), 6)}
            for l in range(r.induction.shape[0]) for h in range(r.induction.shape[1])]
    return {"command": "survey", "detector": "induction", "model": r.model.name,
            "tokens_per_half": r.n, "seeds": r.seeds,
            "top": [{"layer": l, "head": h, "induction": round(s, 6)}
                    for l, h, s in _top(r.induction, top)],
            "heads": rows,
            "loss": {"first_half": round(r.loss_first, 6), "repeated_half": round(r.loss_repeated, 6),
                     "removed": [[l, h] for l, h in r.removed],
                     "repeated_half_without_removed": None if r.loss_removed is None
                     else round(r.loss_removed, 6)}}


@renderables.register(Induction)
def _induction(result, width: int, top: int = 3, **_) -> list:
    return induction_renderables(result, top)


@data.register(Induction)
def _induction_data(result, top: int = 3, **_) -> dict:
    return induction_data(result, top)
