"""Induction heads in a causal model (Olsson et al. 2022): random whole-word tokens, repeated.

A sequence of n random tokens followed by the same n tokens again. On the repeated half a model
can predict every token by finding its earlier copy and copying the token after it; the heads
that do it attend from each token to the token after its earlier copy. The induction score of a
head is that attention averaged over the repeated half (the definition TransformerLens and the
ARENA material use). The loss on the repeated half falls far below the first half's when the
model has induction heads, and rises again when they are removed.

Plain data; the renderer draws it. Layers and heads are counted from 1.
"""

from dataclasses import dataclass

import numpy as np
import torch

from mha_trace.core.detectors import induction_scores, previous_token_scores
from mha_trace.errors import MhaError
from mha_trace.models.base import LanguageModel, ModelCard
from mha_trace.records import Shows


def word_tokens(model, count: int, seed: int) -> list[int]:
    """`count` distinct random vocabulary tokens that are whole words (a leading space, then 3 or
    more letters), drawn with `seed`."""
    pool = [i for i in range(model.vocab_size) if _whole_word(model.tokenizer.decode([i]))]
    rng = np.random.default_rng(seed)
    return [pool[j] for j in rng.choice(len(pool), size=count, replace=False)]


def _whole_word(text: str) -> bool:
    return text.startswith(" ") and len(text) >= 4 and text[1:].isascii() and text[1:].isalpha()


def _losses(model, hidden: torch.Tensor, ids: list[int], n: int) -> tuple[float, float]:
    """(mean next-token loss over the first half, over the repeated half), in nats."""
    logits = model.logits_at(hidden, slice(1, 2 * n))  # position p predicts token p + 1
    targets = torch.tensor(ids[2:2 * n + 1], device=logits.device)
    loss = torch.nn.functional.cross_entropy(logits.double(), targets, reduction="none").cpu()
    return float(loss[:n - 1].mean()), float(loss[n:].mean())


@dataclass
class Induction(Shows):
    model: object
    n: int  # random tokens in each half
    seeds: list
    induction: np.ndarray  # (layers, heads), averaged over the seeds
    previous: np.ndarray  # (layers, heads) previous-token scores on the same sequences
    loss_first: float  # mean next-token loss on the first half (nats)
    loss_repeated: float  # ... and on the repeated half
    removed: list  # the top heads ablated, [(layer, head)]
    loss_removed: float | None  # the repeated half's loss without them


def induction(model: LanguageModel, n: int = 50, seeds: tuple = (0, 1, 2), ablate_top: int = 0,
              on_pass=lambda: None) -> Induction:
    """Every head's induction score on random whole-word tokens repeated twice, each seed its
    own sequence; the losses of both halves; with `ablate_top` K, the repeated half's loss with
    the K best induction heads removed."""
    from mha_trace.analyses.model_analysis import _run_with

    if not model.capabilities.language_model:
        raise MhaError(f"{model.name} has no words to repeat: --induction draws whole words from a "
                       f"language model's vocabulary (train reports a trained run's induction "
                       f"heads as they form; survey --checkpoint without --induction scores its "
                       f"probe)", quantity="induction")
    runs = []
    with model.resident():
        for seed in seeds:
            words = word_tokens(model, n, seed)
            ids = [model.bos] + words + words
            hidden, _, weights = model.run(ids)
            w = torch.stack(weights)[:, 0].double().cpu().numpy()  # (L, H, T, T)
            runs.append((ids, w, _losses(model, hidden, ids, n)))
            on_pass()
        scores = np.mean([induction_scores(w, n) for _, w, _ in runs], axis=0)
        previous = np.mean([previous_token_scores(w) for _, w, _ in runs], axis=0)
        order = np.argsort(-scores, axis=None)[:ablate_top]
        removed = [(int(i // scores.shape[1]) + 1, int(i % scores.shape[1]) + 1) for i in order]
        loss_removed = None
        if removed:
            plan: dict = {}
            for layer, head in removed:
                plan.setdefault(layer, []).append((None, head))
            after = []
            for ids, _, _ in runs:
                after.append(_losses(model, _run_with(model, ids, plan), ids, n)[1])
                on_pass()
            loss_removed = float(np.mean(after))
    first, repeated = np.mean([loss for _, _, loss in runs], axis=0)
    return Induction(ModelCard.of(model), n, list(seeds), scores, previous, float(first), float(repeated),
                     removed, loss_removed)
