"""What a pretrained model's heads do: remove heads and measure, and score every head's behaviour.

Plain data; the renderers draw it. Heads and layers are counted from 1.
"""

import string
from dataclasses import dataclass

import numpy as np
import torch

from mha_trace.errors import MhaError
from mha_trace.output import Shows

# the built-in survey set: short sentences with previous-token, punctuation and "it" structure
SURVEY_SENTENCES = (
    "The animal didn't cross the street because it was too tired.",
    "The trophy didn't fit in the suitcase because it was too big.",
    "When the cat saw the mouse, it ran under the old wooden table.",
    "Paris is the capital of France, and Berlin is the capital of Germany.",
    "She gave him the book, but he never read a single page of it.",
    "Attention lets every token look at every other token in the sentence.",
)


def check_heads(model, heads: list[tuple[int, int]]) -> None:
    for layer, head in heads:
        if not 1 <= layer <= model.layers or not 1 <= head <= model.heads:
            raise MhaError(f"head {layer}.{head} is out of range ({model.name} has layers 1 to "
                           f"{model.layers} and heads 1 to {model.heads} in each)", quantity="head")


@dataclass
class ModelAblation(Shows):
    sentence: object  # models.sentence.Sentence: the full run
    removed: list  # [(layer, head)]
    output: np.ndarray  # (T, D) final vectors with those heads zeroed before W_O
    distance: np.ndarray  # (T,) L2 distance from the full model's final vectors
    relative: np.ndarray  # (T,) distance / norm of the full vector
    cosine: np.ndarray  # (T,) cosine similarity with the full vector
    next_full: np.ndarray | None = None  # causal models: next-token probabilities, full model
    next_ablated: np.ndarray | None = None  # ... and with the heads removed

    @property
    def top(self) -> int:
        return int(np.argmax(self.next_full))

    @property
    def kl(self) -> float:
        """KL(full ‖ ablated) of the next-token distributions, in nats."""
        p, q = self.next_full, self.next_ablated
        keep = p > 0
        return float(np.sum(p[keep] * (np.log(p[keep]) - np.log(np.maximum(q[keep], 1e-45)))))


def _run_with(model, ids, plan: dict, batch: int = 1):
    """The model on `ids` with heads removed; plan: layer -> [(batch rows or None, head)]."""
    from mha_trace.ablation import heads_zeroed

    with heads_zeroed({model.attention_module(l): t for l, t in plan.items()}), torch.no_grad():
        out, _, _ = model.run(ids, batch=batch)
    return out


def next_token_probabilities(model, hidden: torch.Tensor) -> np.ndarray:
    """(B, V) softmax of the last position's logits."""
    return torch.softmax(model.logits(hidden).double(), dim=-1).cpu().numpy()


def ablate(sentence, removed: list[tuple[int, int]]) -> ModelAblation:
    """Run the model again with the given heads' slices of the concatenation zeroed before W_O."""
    model = sentence.model
    check_heads(model, removed)
    plan = {}
    for layer, head in removed:
        plan.setdefault(layer, []).append((None, head))
    out = _run_with(model, sentence.ids, plan)
    full = sentence.output
    ablated = out[0].cpu().numpy()
    distance = np.linalg.norm(ablated - full, axis=1)
    norms = np.linalg.norm(full, axis=1)
    cosine = (ablated * full).sum(1) / (np.linalg.norm(ablated, axis=1) * norms)
    result = ModelAblation(sentence, sorted(removed), ablated, distance, distance / norms, cosine)
    if model.causal:
        result.next_full = next_token_probabilities(model, torch.from_numpy(full)[None].to(model.device))[0]
        result.next_ablated = next_token_probabilities(model, out)[0]
    return result


@dataclass
class HeadRanking(Shows):
    sentence: object
    heads: list  # [(layer, head)] in the order of `effect`, largest first
    effect: np.ndarray  # causal: KL of the next-token distribution; else mean relative movement
    top_drop: np.ndarray | None  # causal: how much the top-1 token's probability fell
    measure: str
    top_token: int | None = None  # causal: the full model's most likely next token


def rank_heads(sentence, on_layer=lambda: None) -> HeadRanking:
    """Remove every head on its own: one batched pass per layer, one copy of the sentence per
    head of that layer (`on_layer()` after each). Refused when estimated over the time guard."""
    from mha_trace.models import check_time

    model = sentence.model
    check_time(model, len(sentence.ids), model.layers * model.heads, "Ranking every head")
    heads = [(l, h) for l in range(1, model.layers + 1) for h in range(1, model.heads + 1)]
    outs = []
    with model.resident():
        for layer in range(1, model.layers + 1):
            plan = {layer: [([h - 1], h) for h in range(1, model.heads + 1)]}
            o = _run_with(model, sentence.ids, plan, batch=model.heads)
            outs.append(o[:, -1:] if model.causal else o)  # a causal model: the next token's
            on_layer()
    out = torch.cat(outs)
    full = torch.from_numpy(sentence.output)[None].to(model.device)
    if model.causal:
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
    return HeadRanking(sentence, [heads[i] for i in order], effect[order],
                       None if drop is None else drop[order], measure, top)


def _is_punctuation(token: str) -> bool:
    return bool(token) and all(ch in string.punctuation for ch in token)


def detector_scores(sentence) -> dict[str, np.ndarray]:
    """(layers, heads) scores: the mean weight a query gives to its kind of key.

    previous / next / self: the key just before, just after, the query itself; first: the
    first token ([CLS]); last: the final [SEP]; punctuation: all punctuation keys together.
    Queries without such a key (the first has no previous) are left out of that mean.
    """
    w, tokens = sentence.weights, sentence.tokens
    T = len(tokens)
    i = np.arange(T)
    punct = np.array([_is_punctuation(t) for t in tokens])
    causal = getattr(getattr(sentence, "model", None), "causal", False)
    scores = {"previous token": w[..., i[1:], i[1:] - 1].mean(-1)}
    if not causal:  # a causal model's query never sees the next token or the last one
        scores["next token"] = w[..., i[:-1], i[:-1] + 1].mean(-1)
    scores["self"] = w[..., i, i].mean(-1)
    if causal:
        scores["first token (sink)"] = w[..., 1:, 0].mean(-1)  # the first query has no choice
    else:
        scores["first token ([CLS])"] = w[..., :, 0].mean(-1)
        scores["last token ([SEP])"] = w[..., :, T - 1].mean(-1)
    if punct.any():
        scores["punctuation"] = w[..., :, punct].sum(-1).mean(-1)
    return scores


@dataclass
class Survey(Shows):
    model: object
    sentences: list  # the Sentence records scored
    scores: dict  # detector name -> (layers, heads), averaged over the sentences
    probe: dict | None = None  # coreference: {"from": token, "to": [...], "scores": {to: (L, H)}}
    builtin: bool = True  # the built-in sentence set (else the user's own sentence)

    @property
    def sinks(self) -> dict:
        """Sink name -> (layers,) the share of attention a layer's heads give it, averaged over
        heads, queries and sentences: the first token for a causal model (its first query, which
        has no other key, left out), [CLS] and [SEP] for an encoder."""
        found = {n: s.mean(-1) for n, s in self.scores.items()
                 if n in ("first token (sink)", "first token ([CLS])", "last token ([SEP])")}
        return found


def survey(model, sentences: list[str], source: str | None = None,
           targets: list[str] | None = None, builtin: bool = True) -> Survey:
    """Score every head on every sentence, and average; with a probe, also source -> targets."""
    with model.resident():  # SmolLM2: dequantised once for all the sentences, not per sentence
        runs = [model.encode(s) for s in sentences]
    short = next((r for r in runs if len(r.tokens) < 3), None)
    if short is not None:
        n = len(short.tokens)
        raise MhaError(f"'{short.text}' is only {n} token{'s' if n != 1 else ''} "
                       f"({' '.join(short.tokens)}); a survey scores each query's previous and next "
                       f"token, so it needs at least 3", quantity="sentence")
    per = [detector_scores(r) for r in runs]
    names = [n for n in per[0] if all(n in p for p in per)] + [
        n for n in ("punctuation",) if n not in per[0] and any(n in p for p in per)]
    scores = {n: np.mean([p[n] for p in per if n in p], axis=0) for n in names}
    probe = None
    if source is not None:
        if not targets:
            raise MhaError("the coreference probe needs the candidate tokens too, e.g. "
                           "animal,street", quantity="to")
        probe = coreference(runs, source, targets)
    return Survey(model, runs, scores, probe, builtin)


def coreference(runs, source: str, targets: list[str]) -> dict:
    """Per head: the weight from `source` (e.g. it) to each target token (summed over its pieces),
    averaged over the sentences that hold them all."""
    used, per_target = [], {t: [] for t in targets}
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
            current, start = tok.removeprefix("▁"), i
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


def predict(model, text: str, k: int = 10, generate: int = 0,
            on_token=lambda: None) -> Prediction:
    """The next-token distribution of a causal model; with generate, that many greedy tokens
    (`on_token()` after each: one pass of the model per token, over that token alone)."""
    if not model.causal:
        raise MhaError(f"{model.name} is an encoder: it has no next token to predict (try "
                       f"--model smollm2)", quantity="model")
    _, ids = model.tokenize(text)
    out, generated = model.generate(ids, generate, on_token)
    p = next_token_probabilities(model, out)[0]
    order = np.argsort(-p, kind="stable")[:k]
    return Prediction(model, text, [(int(i), float(p[i])) for i in order], generated)
