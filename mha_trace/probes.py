"""What a pretrained model's heads do: remove heads and measure, and score every head's behaviour.

Plain data; the renderers draw it. Heads and layers are counted from 1.
"""

import string
from dataclasses import dataclass

import numpy as np
import torch

from mha_trace.errors import MhaError

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
class ModelAblation:
    sentence: object  # models.<name>.Sentence: the full run
    removed: list  # [(layer, head)]
    output: np.ndarray  # (T, D) final vectors with those heads zeroed before W_O
    distance: np.ndarray  # (T,) L2 distance from the full model's final vectors
    relative: np.ndarray  # (T,) distance / norm of the full vector
    cosine: np.ndarray  # (T,) cosine similarity with the full vector


def ablate(sentence, removed: list[tuple[int, int]]) -> ModelAblation:
    """Run the model again with the given heads' slices of the concatenation zeroed before W_O."""
    model = sentence.model
    check_heads(model, removed)
    d_k = model.d_model // model.heads
    hooks = []
    for layer in sorted({l for l, _ in removed}):
        heads = [h for l, h in removed if l == layer]

        def zero(_, args, heads=heads):
            concat = args[0].clone()
            for h in heads:
                concat[..., (h - 1) * d_k:h * d_k] = 0.0
            return (concat,)

        hooks.append(model.encoder.layers[layer - 1].attention.W_o.register_forward_pre_hook(zero))
    try:
        with torch.no_grad():
            out, _, _ = model.run(sentence.ids)
    finally:
        for hook in hooks:
            hook.remove()
    out, full = out[0].numpy(), sentence.output
    distance = np.linalg.norm(out - full, axis=1)
    norms = np.linalg.norm(full, axis=1)
    cosine = (out * full).sum(1) / (np.linalg.norm(out, axis=1) * norms)
    return ModelAblation(sentence, sorted(removed), out, distance, distance / norms, cosine)


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
    scores = {
        "previous token": w[..., i[1:], i[1:] - 1].mean(-1),
        "next token": w[..., i[:-1], i[:-1] + 1].mean(-1),
        "self": w[..., i, i].mean(-1),
        "first token ([CLS])": w[..., :, 0].mean(-1),
        "last token ([SEP])": w[..., :, T - 1].mean(-1),
    }
    if punct.any():
        scores["punctuation"] = w[..., :, punct].sum(-1).mean(-1)
    return scores


@dataclass
class Survey:
    model: object
    sentences: list  # the Sentence records scored
    scores: dict  # detector name -> (layers, heads), averaged over the sentences
    probe: dict | None = None  # coreference: {"from": token, "to": [...], "scores": {to: (L, H)}}
    builtin: bool = True  # the built-in sentence set (else the user's own sentence)


def survey(model, sentences: list[str], source: str | None = None,
           targets: list[str] | None = None, builtin: bool = True) -> Survey:
    """Score every head on every sentence, and average; with a probe, also source -> targets."""
    runs = [model.encode(s) for s in sentences]
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
        raise MhaError(f"no sentence holds '{source}' and every one of {', '.join(targets)} "
                       f"(give one with --sentence)", quantity="to")
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
            current, start = tok, i
        end_of_word = i + 1 == len(sentence.tokens) or sentence.words[i + 1] != word
        if end_of_word and current not in spans:
            spans[current] = list(range(start, i + 1))
    return spans
