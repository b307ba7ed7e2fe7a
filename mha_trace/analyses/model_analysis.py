"""What a pretrained model's heads do: remove heads and measure, and score every head's behaviour.

Plain data; the renderers draw it. Heads and layers are counted from 1.
"""

from dataclasses import dataclass

import numpy as np
import torch

from mha_trace.errors import MhaError
from mha_trace.io.units import WORD_START
from mha_trace.analyses.ablated import Ablation
from mha_trace.models.base import AttentionModel, LanguageModel, ModelCard, ModelText
from mha_trace.runs.model_options import check_heads
from mha_trace.records import Shows

def _run_with(model, ids, plan: dict, batch: int = 1, resume=None):
    """The model on `ids` with heads removed; plan: layer -> [(batch rows or None, head)].
    resume (layer, x): start at that layer from its input x (the layers below are unchanged)."""
    from mha_trace.core.ablation import heads_zeroed

    with heads_zeroed({model.attention_module(l): t for l, t in plan.items()}):
        out, _, _ = model.run(ids, batch=batch, resume=resume)
    return out


def next_token_probabilities(model, hidden: torch.Tensor) -> np.ndarray:
    """(B, V) softmax of the last position's logits."""
    return torch.softmax(model.logits(hidden).double(), dim=-1).cpu().numpy()


def ablate_model_heads(sentence, removed: list[tuple[int, int]]) -> Ablation:
    """Run the model again with the given heads' slices of the concatenation zeroed before W_O."""
    model = sentence.model
    check_heads(model, removed)
    plan: dict = {}
    for layer, head in removed:
        plan.setdefault(layer, []).append((None, head))
    out = _run_with(model, sentence.ids, plan)
    full = sentence.output
    nexts = (next_token_probabilities(model, torch.from_numpy(full)[None].to(model.device))[0],
             next_token_probabilities(model, out)[0]) if model.capabilities.causal else (None, None)
    induction = None
    if model.capabilities.trained_run:  # a trained run: what removing them does to its induction heads
        from mha_trace.analyses.composition import probe_roles

        induction = (probe_roles(model)["induction"], probe_roles(model, plan)["induction"])
    words = None
    if nexts[0] is not None:  # the next tokens the view names: the top one, the top 5 without
        named = {int(np.argmax(nexts[0]))} | {int(i) for i in np.argsort(-nexts[1])[:5]}
        words = {i: model.token_text(i) for i in named}
    return Ablation(ModelText.of(sentence), tuple(sentence.labels), sorted(removed), full,
                    out[0].cpu().numpy(), *nexts, induction, words)


@dataclass
class HeadRanking(Shows):
    sentence: object
    heads: list  # [(layer, head)] in the order of `effect`, largest first
    effect: np.ndarray  # causal: KL of the next-token distribution; else mean relative movement
    top_drop: np.ndarray | None  # causal: how much the top-1 token's probability fell
    measure: str
    top_token: int | None = None  # causal: the full model's most likely next token
    top_text: str | None = None  # ... as it reads


def rank_heads(sentence, on_layer=lambda: None) -> HeadRanking:
    """Remove every head on its own, one copy of the sentence per head, all in one pass: at each
    layer its heads' copies join the batch, each with its head removed, beside the copies whose
    head was removed below (`on_layer()` after each layer). Refused when estimated over the time
    guard."""
    from mha_trace.core.ablation import heads_gated
    from mha_trace.models.guards import check_time
    from mha_trace.speedups import batch_work

    model = sentence.model
    check_time(model, len(sentence.ids), model.layers * model.heads, "Ranking every head")
    heads = [(l, h) for l in range(1, model.layers + 1) for h in range(1, model.heads + 1)]
    H, x = model.heads, None
    with model.resident(), batch_work(), torch.no_grad():
        for layer in range(1, model.layers + 1):
            joining = sentence.inputs[layer - 1].expand(H, -1, -1)  # the layers below run as they did
            x = joining if x is None else torch.cat([x, joining])
            gates = torch.ones(len(x), H)
            gates[-H:] -= torch.eye(H)  # copy k of this layer's: head k removed
            with heads_gated({model.attention_module(layer): lambda _, g=gates: g}):
                x, _, _ = model.run(sentence.ids, resume=(layer, x), last=layer)
            on_layer()
    out = x[:, -1:] if model.capabilities.causal else x  # a causal model: the next token's
    full = torch.from_numpy(sentence.output)[None].to(model.device)
    if model.capabilities.causal:
        p = next_token_probabilities(model, full)[0]
        q = next_token_probabilities(model, out)
        keep = p > 0
        effect = np.sum(p[keep] * (np.log(p[keep]) - np.log(np.maximum(q[:, keep], 1e-45))), axis=1)
        top = int(np.argmax(p))
        drop, measure = p[top] - q[:, top], "KL(full ‖ ablated) of the next-token distribution"
    else:
        top = None
        moved = np.linalg.norm(out.cpu().numpy() - sentence.output, axis=2)
        effect = (moved / np.linalg.norm(sentence.output, axis=1)).mean(1)
        drop, measure = None, "mean relative movement of the final vectors"
    order = np.argsort(-effect, kind="stable")
    return HeadRanking(ModelText.of(sentence), [heads[i] for i in order], effect[order],
                       None if drop is None else drop[order], measure, top,
                       None if top is None else model.token_text(top))


@dataclass
class Antecedents:
    """Where "it" looks, in the sentences whose antecedent stands in one role."""

    role: str  # "subject" or "object"
    sentences: list  # their texts
    antecedent: np.ndarray  # (sentences, layers, heads): the weight from "it" to the antecedent
    other: np.ndarray  # ... and to the other candidate

    @property
    def right(self) -> np.ndarray:
        """(layers, heads): the share of sentences where a head favours the true antecedent."""
        return (self.antecedent > self.other).mean(0)


@dataclass
class Survey(Shows):
    model: object
    corpus: str  # how the output names the sentences: "the bundled corpus of 120 sentences"
    sentences: list  # the texts scored (models.base.ModelText)
    detectors: dict  # detector name -> detectors.Detector over the sentences it applies to
    antecedents: list  # [Antecedents], one per role, when the corpus knows them
    probe: dict | None = None  # --from/--to: {"from": token, "to": [...], "scores": {to: (L, H)}}
    effect_detectors: dict | None = None  # --effect: the detectors on the effect weights

    @property
    def scores(self) -> dict:
        """detector name -> (layers, heads): the mean over the sentences."""
        return {name: d.mean for name, d in self.detectors.items()}

    @property
    def sinks(self) -> dict:
        """Sink name -> (layers,) the share of attention a layer's heads give it, averaged over
        heads, queries and sentences: the first token for a causal model (its first query, which
        has no other key, left out), [CLS] and [SEP] for an encoder."""
        return _sinks(self.detectors)

    @property
    def effect_sinks(self) -> dict | None:
        """As `sinks`, for the effect weights (--effect); None without them."""
        return None if self.effect_detectors is None else _sinks(self.effect_detectors)


def _sinks(detectors: dict) -> dict:
    return {n: d.mean.mean(-1) for n, d in detectors.items() if n in ("first token", "[CLS]", "[SEP]")}


def survey(model: AttentionModel, corpus, source: str | None = None, targets: list[str] | None = None,
           on_sentence=lambda: None, effect: bool = False) -> Survey:
    """Score every head on every sentence of a corpus.Corpus (batched by length); with a probe,
    also the weight from `source` to each target; with `effect`, the detectors on the effect
    weights too."""
    from mha_trace.core.detectors import detect, gather
    from mha_trace.models.sentence import encode_all
    from mha_trace.speedups import batch_work

    with model.resident(), batch_work():  # SmolLM2: dequantised once for all the sentences
        runs = encode_all(model, corpus.sentences, keep_inputs=False, effect=effect,
                          on_sentence=on_sentence)
    check_lengths(runs)
    detectors = gather([detect(r.weights, r.tokens, r.ids, model.capabilities.causal) for r in runs])
    probe = None
    if source is not None:
        if not targets:
            raise MhaError("the coreference probe needs the candidate tokens too, e.g. "
                           "animal,street", quantity="to")
        probe = coreference(runs, source, targets)
    moved = gather([detect(r.effect, r.tokens, r.ids, model.capabilities.causal) for r in runs]) if effect else None
    card = ModelCard.of(model)
    return Survey(card, corpus.name, [ModelText(card, r.text) for r in runs], detectors, antecedents(runs, corpus.antecedents),
                  probe, moved)


def check_lengths(runs) -> None:
    """A survey scores each query's previous and next token: every sentence needs 3 tokens."""
    short = next((r for r in runs if len(r.tokens) < 3), None)
    if short is not None:
        n = len(short.tokens)
        raise MhaError(f"'{short.text}' is only {n} token{'s' if n != 1 else ''} "
                       f"({' '.join(short.tokens)}); a survey scores each query's previous and next "
                       f"token, so it needs at least 3", quantity="sentence")


def antecedents(runs, probes: list) -> list:
    """Per role, the weight from "it" (its pieces' rows averaged) to the antecedent and to the
    other candidate (each summed over its pieces)."""
    by_text = {r.text: r for r in runs}
    found: dict = {}
    for p in probes:
        r = by_text[p.sentence]
        words = _word_spans(r)
        rows = r.weights[..., words["it"], :]
        pair = [rows[..., words[w]].sum(-1).mean(-1) for w in (p.antecedent, p.other)]
        found.setdefault(p.role, ([], [], []))
        for part, value in zip(found[p.role], (p.sentence, *pair)):
            part.append(value)
    return [Antecedents(role, texts, np.stack(a), np.stack(o))
            for role, (texts, a, o) in found.items()]


def coreference(runs, source: str, targets: list[str]) -> dict:
    """Per head: the weight from `source` (e.g. it) to each target token (summed over its pieces),
    averaged over the sentences that hold them all."""
    used, per_target = [], {t: list[float]() for t in targets}
    for r in runs:
        words = _word_spans(r)
        if source not in words or any(t not in words for t in targets):
            continue
        used.append(r.text)
        rows = words[source]
        for t in targets:
            per_target[t].append(r.weights[..., rows, :][..., :, words[t]].sum(-1).mean(-1))
    if not used:
        from mha_trace.errors import printable

        if not any(source in _word_spans(r) for r in runs):
            raise MhaError(f"no sentence holds '{printable(source)}' (give one that does with "
                           f"--sentence)", quantity="from")
        raise MhaError(f"no sentence holds '{printable(source)}' and every one of "
                       f"{printable(', '.join(targets))} (give one with --sentence)", quantity="to")
    return {"from": source, "to": targets, "sentences": used,
            "scores": {t: np.mean(v, axis=0) for t, v in per_target.items()}}


def _word_spans(sentence) -> dict:
    """word text -> the token positions of its first occurrence (pieces joined: '##' dropped)."""
    spans, current, start = {}, "", None
    for i, (tok, word) in enumerate(zip(sentence.tokens, sentence.words)):
        if word is None:
            continue
        if i and sentence.words[i - 1] == word:
            current += tok.removeprefix("##")
        else:
            current, start = tok.removeprefix(WORD_START), i
        end_of_word = i + 1 == len(sentence.tokens) or sentence.words[i + 1] != word
        if end_of_word and current not in spans:
            spans[current] = list(range(start, i + 1))
    return spans


@dataclass
class Prediction(Shows):
    model: object
    text: str
    top: list  # [(token id, probability)], most likely first
    generated: list  # greedy continuation, token ids
    words: dict  # token id -> how it reads, for every id above
    continuation: str  # the generated ids decoded


def predict(model: LanguageModel, text: str, k: int = 10, generate: int = 0,
            on_token=lambda: None) -> Prediction:
    """The next-token distribution of a causal model; with generate, that many greedy tokens
    (`on_token()` after each: one pass of the model per token, over that token alone)."""
    if not model.capabilities.causal:
        raise MhaError(f"{model.name} is an encoder: it has no next token to predict (try "
                       f"--model smollm2)", quantity="model")
    if not model.capabilities.language_model:
        raise MhaError(f"{model.name} predicts its task's targets, not the next token of text: "
                       f"predict needs a language model (try --model smollm2)", quantity="model")
    ids = model.tokenize(text)
    out, generated = model.generate(ids, generate, on_token)
    p = next_token_probabilities(model, out)[0]
    order = np.argsort(-p, kind="stable")[:k]
    words = {i: model.token_text(i) for i in {*map(int, order), *generated}}
    return Prediction(ModelCard.of(model), text, [(int(i), float(p[i])) for i in order], generated,
                      words, model.tokenizer.decode(generated))
