"""What a head does on one sentence: the survey's detectors, each a score per head and a chance level.

A detector's score is the weight a query gives to its kind of key (the key just before it, the
first token, every punctuation mark, ...), averaged over the queries that have such a key. Its
chance level is what a head that spread each query's weight evenly over the keys it sees would
score, so a score reads against it: 0.3 on the previous token is five times chance in a sentence
of 15 tokens. Plain numpy on (layers, heads, T, T) weights; heads and layers from 1 elsewhere.
"""

import string
from dataclasses import dataclass

import numpy as np

from mha_trace.io.units import WORD_START

HOLDS = 0.5  # a head does a thing on a sentence when it gives it more than half of the weight


@dataclass
class Found:
    """One detector on one sentence."""

    scores: np.ndarray  # (layers, heads): the mean weight on that kind of key
    chance: float  # what an even spread over the keys each query sees would score


def is_punctuation(token: str) -> bool:
    token = token.removeprefix(WORD_START).removeprefix("##")
    return bool(token) and all(ch in string.punctuation for ch in token)


def _mean_over(w: np.ndarray, pairs: list, seen: np.ndarray) -> Found | None:
    """pairs: [(query, [keys])]. The weight each query gives its keys, summed, averaged over the
    queries; chance: len(keys) / keys seen, averaged the same way."""
    pairs = [(q, ks) for q, ks in pairs if ks]
    if not pairs:
        return None
    scores = np.mean([w[..., q, ks].sum(-1) for q, ks in pairs], axis=0)
    return Found(scores, float(np.mean([len(ks) / seen[q] for q, ks in pairs])))


def detect(weights: np.ndarray, tokens: tuple, ids: tuple, causal: bool) -> dict[str, Found]:
    """Every detector that applies to this sentence.

    previous / next token, self; a sink: the first token (a causal model's sink, BERT's [CLS])
    and BERT's final [SEP]; punctuation (every mark together); duplicate token (a repeated
    token's earlier copies) and induction (the token after an earlier copy, when that is not the
    previous token). A causal model's first query sees only itself and is left out.
    """
    T = len(tokens)
    seen = np.arange(1, T + 1) if causal else np.full(T, T)  # keys query i sees
    queries = range(1, T) if causal else range(T)
    keys = (lambda q: range(q + 1)) if causal else (lambda q: range(T))
    punct = [i for i, t in enumerate(tokens) if is_punctuation(t)]
    earlier = {q: [j for j in range(q) if ids[j] == ids[q]] for q in queries}
    pairs = {
        "previous token": [(q, [q - 1]) for q in queries if q >= 1],
        "next token": [] if causal else [(q, [q + 1]) for q in range(T - 1)],
        "self": [(q, [q]) for q in queries],
        ("first token" if causal else "[CLS]"): [(q, [0]) for q in queries],
        "[SEP]": [] if causal else [(q, [T - 1]) for q in range(T)],
        "punctuation": [(q, [k for k in keys(q) if k in punct]) for q in queries],
        "duplicate token": [(q, earlier[q]) for q in queries],
        "induction": [(q, [j + 1 for j in earlier[q] if j + 1 < q - 1]) for q in queries],
    }
    found = {name: _mean_over(weights, p, seen) for name, p in pairs.items()}
    return {name: f for name, f in found.items() if f is not None}


@dataclass
class Detector:
    """One detector over many sentences (those it applies to)."""

    name: str
    scores: np.ndarray  # (sentences, layers, heads)
    chance: np.ndarray  # (sentences,)

    @property
    def mean(self) -> np.ndarray:
        return self.scores.mean(0)

    @property
    def spread(self) -> np.ndarray:
        """The standard deviation over the sentences, per head."""
        return self.scores.std(0)

    @property
    def held(self) -> np.ndarray:
        """The share of sentences on which a head gives this more than half its weight."""
        return (self.scores > HOLDS).mean(0)


def gather(per_sentence: list[dict]) -> dict[str, Detector]:
    """Per detector, every sentence it applied to; in the order detect() names them."""
    names = list(dict.fromkeys(n for found in per_sentence for n in found))
    return {n: Detector(n, np.stack([f[n].scores for f in per_sentence if n in f]),
                        np.array([f[n].chance for f in per_sentence if n in f]))
            for n in names}


def induction_scores(weights: np.ndarray, n: int, start: int = 1) -> np.ndarray:
    """(..., heads) mean weight from each repeated token to the token after its earlier copy.

    weights: (..., T, T) with the first copy at positions start .. start + n - 1 and the second
    at start + n .. start + 2n - 1 (start = 1 after a beginning-of-text token)."""
    queries = np.arange(start + n, start + 2 * n)
    return weights[..., queries, queries - n + 1].mean(-1)


def induction_chance(n: int, start: int = 1) -> float:
    """The induction score of a head that spreads its weight evenly over the keys it sees: each
    repeated query at position q (from 0) sees q + 1 keys under the causal mask."""
    queries = np.arange(start + n, start + 2 * n)
    return float(np.mean(1.0 / (queries + 1)))


def previous_token_scores(weights: np.ndarray) -> np.ndarray:
    """(..., heads) mean weight from each token to the one before it (the first query left out)."""
    T = weights.shape[-1]
    i = np.arange(1, T)
    return weights[..., i, i - 1].mean(-1)
