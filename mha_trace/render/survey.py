"""Render `survey`: the top heads per behaviour, and a layer × head grid per detector."""

import numpy as np
from rich.text import Text

from mha_trace.io.output import new_table
from mha_trace.render.matrices import shade
from mha_trace.records import data, renderables
from mha_trace.analyses.induction import Induction
from mha_trace.analyses.model_analysis import Survey
from mha_trace.core.detectors import induction_chance
from mha_trace.core.head import Head, head_names

SPECIALISED = 0.9  # a head is called specialised when it holds on this share of the sentences


def _top(scores: np.ndarray, n: int) -> list[tuple[int, int, float]]:
    order = np.argsort(-scores, axis=None, kind="stable")[:n]
    return [(int(i // scores.shape[1]) + 1, int(i % scores.shape[1]) + 1, float(scores.flat[i]))
            for i in order]


def survey_renderables(result, top: int, width: int, grids: bool = False) -> list:
    m = result.model
    out = [Text(f"survey: {m.name}, {m.layers} layers × {m.heads} heads, on {result.corpus}",
                style="bold")]
    many = len(result.sentences) > 1
    table = new_table(f"Top {top} per behaviour: mean weight to that key, ±sd over sentences, % "
                      f"over ½" if many else f"Top {top} heads per behaviour: the mean weight a "
                      f"query gives that key")
    table.add_column("behaviour\n", style="bold", no_wrap=True)
    table.add_column("chance\n", justify="right")
    for k in range(top):
        table.add_column(f"#{k + 1}\nhead " + ("mean±sd >½" if many else "mean"), justify="right",
                         no_wrap=True)
    for name, d in result.detectors.items():
        cells = [f"{Head(l, h)} {_num(d.mean[l - 1, h - 1])}" + (
            f"±{_num(d.spread[l - 1, h - 1])} {d.held[l - 1, h - 1]:.0%}" if many else "")
            for l, h, _ in _top(d.mean, top)]
        table.add_row(name, _num(d.chance.mean()), *cells)
    out.append(table)
    if many:
        out.append(Text("\n".join(specialised_lines(result, width))))
    if result.antecedents:
        out += antecedent_renderables(result, top)
    for name, scores in _grids(result, grids).items():
        grid = new_table(f"{name}: every layer × head" + (" (mean over the sentences)" if many else ""))
        grid.add_column("layer", justify="right", style="bold")
        for h in range(m.heads):
            grid.add_column(str(h + 1), justify="right", no_wrap=True)
        for layer in range(m.layers):
            grid.add_row(str(layer + 1), *(Text(_num(x), style=shade(float(x))) for x in scores[layer]))
        out.append(grid)
    if result.probe:
        used = "; ".join(f"\"{t}\"" for t in result.probe["sentences"])
        out.append(Text(f"Coreference probe: the weight from '{result.probe['from']}' to each "
                        f"candidate, summed over its pieces, in {used}."))
    out.append(Text("\n".join(sink_lines(result))))
    if result.effect_sinks is not None:
        out += effect_renderables(result)
    out.append(Text("Scores are means over the queries that have such a key: previous/next token "
                    "and self need a key in that place; punctuation sums every punctuation key; "
                    "duplicate token sums a repeated token's earlier copies, and induction the "
                    "tokens after them. Chance: the score of a head that spreads each query's "
                    "weight evenly over the keys it sees. --grids shows every head; --format json "
                    "has every number."))
    return out


def _num(x: float) -> str:
    """0.35 -> .35, as the grids print: two decimals without the leading zero; 1 -> 1.0."""
    return f"{x:.2f}".lstrip("0") if x < 0.995 else "1.0"


def _grids(result, every: bool) -> dict:
    """The layer × head grids shown: every behaviour's with --grids, and the probe's."""
    found = dict(result.scores) if every else {}
    if result.probe:
        for target, scores in result.probe["scores"].items():
            found[f"{result.probe['from']} → {target}"] = scores
    return found


def specialised_lines(result, width: int) -> list[str]:
    """Per detector, the heads that hold on at least SPECIALISED of the sentences it applies to,
    as many as fit the width."""
    lines = [f"Specialised heads: over half their weight there on at least {SPECIALISED:.0%} of "
             f"the sentences a behaviour applies to (how many, in brackets)."]
    for name, d in result.detectors.items():
        heads = [f"{Head(l, h)} {d.held[l - 1, h - 1]:.0%}" for l, h, _ in _top(d.held, d.held.size)
                 if d.held[l - 1, h - 1] >= SPECIALISED]
        line = f"  {name} ({len(d.scores)}): "
        if not heads:
            lines.append(line + "none")
            continue
        shown = len(heads)
        while shown > 1 and len(line + ", ".join(heads[:shown]) + f" and {len(heads)} more") > width:
            shown -= 1
        more = f" and {len(heads) - shown} more" if shown < len(heads) else ""
        lines.append(line + ", ".join(heads[:shown]) + more)
    return lines


def _named(chosen: np.ndarray, most: int = 4) -> str:
    """'2 heads (3.5, 6.12)', '28 heads (2.1, ... and 24 more)', 'no head'."""
    heads = [Head.at(l, h).name for l, h in zip(*np.nonzero(chosen))]
    if not heads:
        return "no head"
    more = f" and {len(heads) - most} more" if len(heads) > most else ""
    return f"{len(heads)} head{'s' if len(heads) > 1 else ''} ({', '.join(heads[:most])}{more})"


def antecedent_renderables(result, top: int) -> list:
    """Where "it" looks: per head, the share of sentences where it gives the true antecedent more
    weight than the other candidate, split by the antecedent's role."""
    roles = {a.role: a for a in result.antecedents}
    both = sum(a.right * len(a.sentences) for a in roles.values()) / sum(
        len(a.sentences) for a in roles.values())  # the share over every "it" sentence
    table = new_table("Where \"it\" looks: the share of sentences where a head gives the "
                      "antecedent more weight than the other candidate (chance 50%)")
    table.add_column("head", justify="right", style="bold")
    for role, a in roles.items():
        table.add_column(f"antecedent is the {role} ({len(a.sentences)})", justify="right")
    table.add_column("all", justify="right")
    for layer, head, share in _top(both, top):
        table.add_row(Head(layer, head).name, *(f"{a.right[layer - 1, head - 1]:.0%}" for a in roles.values()),
                      f"{share:.0%}")
    out = [table]
    if {"subject", "object"} <= roles.keys():
        subject, obj = roles["subject"].right, roles["object"].right
        follows = _named((subject >= 0.8) & (obj <= 0.2))
        both = (subject >= 0.8) & (obj >= 0.8)
        resolves = _named(both) + (" are" if both.sum() > 1 else " is")
        out.append(Text(f"{follows} favour the subject whether or not it is the antecedent "
                        f"(right on ≥ 80% of subject sentences, ≤ 20% of object ones); "
                        f"{resolves} right on ≥ 80% of both."))
    return out


def sink_lines(result) -> list[str]:
    """The share of attention each layer gives its sink tokens, and what the literature reports
    for larger models beside what these numbers show."""
    sinks = result.sinks
    by_layer = lambda v: "  ".join(f"{l + 1}: {x:.2f}" for l, x in enumerate(v))
    lines = [f"Attention on the {name}, by layer: {by_layer(v)}" for name, v in sinks.items()]
    if "first token" in sinks and len(sinks["first token"]) > 2:  # the literature's deep models
        v = sinks["first token"]
        rest = v[2:]
        agree = max(v[:2]) < 0.5 < np.median(rest)
        lines.append(f"Xiao et al. 2023 find attention sinks on the first token in every layer of "
                     f"Llama-2 but the first two. {'Here too' if agree else 'Not quite here'}: "
                     f"layers 1-2 give it {v[0]:.2f} and "
                     f"{v[1]:.2f}; the others {np.mean(rest):.2f} on average, and "
                     f"{int((rest > 0.5).sum())} of {len(rest)} give it more than half (least: "
                     f"layer {int(np.argmin(rest)) + 3}, {rest.min():.2f}).")
    elif "[SEP]" in sinks:
        cls, sep = sinks["[CLS]"], sinks["[SEP]"]
        verdict = "Here too" if sep.max() > 0.5 else "Not here"
        lines.append(f"Clark et al. 2019 find BERT-base's middle layers give over half their "
                     f"attention to [SEP]. {verdict}: [SEP] gets at most {sep.max():.2f} in any "
                     f"layer, and [CLS] up to {cls.max():.2f} (layer {int(np.argmax(cls)) + 1}).")
    return lines


def effect_renderables(result) -> list:
    """--effect: per layer, the share of weight and the share of effect that go to the sinks,
    and what the numbers say."""
    weight, effect = result.sinks, result.effect_sinks
    table = new_table("The sinks by layer: the share of weight and the share of effect (weight × "
                      "‖v·W_O‖, renormalised) they get, averaged over heads, queries and sentences")
    table.add_column("layer", justify="right", style="bold")
    for name in weight:
        table.add_column(f"{name}\nweight", justify="right")
        table.add_column(f"{name}\neffect", justify="right")
    for l in range(result.model.layers):
        table.add_row(str(l + 1), *(Text(f"{v[l]:.2f}", style=shade(float(v[l])))
                                    for name in weight for v in (weight[name], effect[name])))
    return [table, Text(effect_verdict(weight, effect))]


SINKLESS = 0.1  # sinks with less weight than this on average are no sinks


def effect_verdict(weight: dict, effect: dict) -> str:
    """What the sinks' weight and effect say, from the numbers: the mean over layers of the
    sinks' total share, and the layer where the two differ most."""
    w, e = sum(weight.values()), sum(effect.values())  # (layers,) every sink together
    names = " and ".join(weight)
    gap = int(np.argmax(w - e))
    verb, they, move = ("get", "they", "move") if len(weight) > 1 else ("gets", "it", "moves")
    said = (f"Over the layers, the {names} {verb} {w.mean():.2f} of the weight and {e.mean():.2f} of "
            f"the effect on average; the widest gap is layer {gap + 1} ({w[gap]:.2f} of the weight, "
            f"{e[gap]:.2f} of the effect). ")
    if w.mean() < SINKLESS:
        return said + (f"That is little weight to begin with: no sink to speak of, whatever "
                       f"{they} {move}.")
    if e.mean() < 0.5 * w.mean():
        return said + (f"Most of the weight {they} {verb} moves little: the value vectors there are "
                       f"short through W_O, so a head parks its attention there when it has "
                       f"nothing to fetch (Kobayashi et al. 2020; Xiao et al. 2023).")
    if e.mean() <= 0.8 * w.mean():
        return said + (f"The effect is smaller than the weight, but by less than half: the weight "
                       f"overstates what {they} {move}, not by much.")
    return said + f"What {they} {verb}, {they} {move}: here the weight reads as the effect."


def survey_data(result, top: int) -> dict:
    grid = lambda a: [[round(float(x), 6) for x in row] for row in a]
    return {"command": "survey", "model": result.model.name, "corpus": result.corpus,
            "sentences": [s.text for s in result.sentences],
            "specialised_when_held_on": SPECIALISED,
            "behaviours": [{"name": name, "sentences": len(d.scores),
                            "chance": round(float(d.chance.mean()), 6),
                            "top": [{"layer": l, "head": h, "score": round(x, 6),
                                     "spread": round(float(d.spread[l - 1, h - 1]), 6),
                                     "held": round(float(d.held[l - 1, h - 1]), 6)}
                                    for l, h, x in _top(d.mean, top)],
                            "scores": grid(d.mean), "spread": grid(d.spread), "held": grid(d.held)}
                           for name, d in result.detectors.items()],
            "antecedents": [{"role": a.role, "sentences": a.sentences, "right": grid(a.right)}
                            for a in result.antecedents],
            "sinks_by_layer": {name: [round(float(x), 6) for x in v]
                               for name, v in result.sinks.items()},
            **({} if result.effect_sinks is None else {
                "sinks_effect_by_layer": {name: [round(float(x), 6) for x in v]
                                          for name, v in result.effect_sinks.items()}}),
            "probe": None if not result.probe else {
                "from": result.probe["from"], "to": result.probe["to"],
                "sentences": result.probe["sentences"],
                "scores": {t: grid(v) for t, v in result.probe["scores"].items()}}}


@renderables.register(Survey)
def _survey(result, width: int, top: int = 3, grids: bool = False, **_) -> list:
    return survey_renderables(result, top, width, grids)


@data.register(Survey)
def _survey_data(result, top: int = 3, **_) -> dict:
    return survey_data(result, top)


def _below(previous: np.ndarray, layer: int) -> str:
    """The best previous-token head one layer below `layer` (counted from 1), with its score."""
    if layer < 2:
        return "—"
    h = int(np.argmax(previous[layer - 2]))
    return f"{Head(layer - 1, h + 1)} {previous[layer - 2, h]:.2f}"


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
        table.add_row(Head(layer, head).name, Text(f"{score:.3f}", style=shade(score)),
                      _below(r.previous, layer))
    out.append(table)
    chance = induction_chance(r.n)  # the mean of 1 / (keys seen) over the repeated half
    strong = int((r.induction > 0.5).sum())
    lines = [f"{strong} of {r.induction.size} heads score above 0.5; a head that spread its "
             f"weight evenly over the keys it sees would score {chance:.4f} (the mean of 1 / keys "
             f"seen over the repeated half).",
             f"Next-token loss, nats per token: first half {r.loss_first:.2f}, repeated half "
             f"{r.loss_repeated:.2f} (a uniform guess over the {m.vocab_size:,}-token vocabulary: "
             f"{np.log(m.vocab_size):.2f}). The repeated half is predicted by copying."]
    if r.removed:
        names = ", ".join(head_names(r.removed))
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
