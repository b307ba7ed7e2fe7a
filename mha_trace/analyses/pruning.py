"""Exercise 5 on a real model: remove heads, least important first, and watch the loss.

Importance is Michel et al. 2019's: put a gate ξ on each head's output (1 keeps it, 0 removes
it); |∂L/∂ξ| for one sentence says how much its loss would change as the head goes, to first
order. Averaged over the corpus and normalised within each layer (their choice, so that layers
compare), it ranks all the heads from one backward pass per batch. The curve itself is measured,
not estimated: at each point the heads are really removed and the corpus's next-token loss taken.

Plain data; the renderer draws it. Layers and heads are counted from 1.
"""

from dataclasses import dataclass

import numpy as np
import torch

from mha_trace.errors import MhaError
from mha_trace.models.base import AttentionModel, LanguageModel, ModelCard
from mha_trace.records import Shows

# the share of heads removed at each point of the curve: every 5% to half, then 3 in 4 and all
FRACTIONS = (0, .05, .1, .15, .2, .25, .3, .35, .4, .45, .5, .75, 1)
GRAD_TOKENS = 512  # a backward pass keeps every activation: smaller batches than a forward's
PASS_TOKENS = 1024  # tokens a forward pass of the curve holds (its logits: 200 MB at SmolLM2's vocabulary)


RISES = (0.05, 0.10)  # the loss rises the exercise asks about: how many heads go before each


@dataclass
class Pruning(Shows):
    model: object
    corpus: str  # how the output names the sentences
    tokens: int  # how many next tokens the loss averages over
    importance: np.ndarray  # (layers, heads): Michel et al.'s score, normalised per layer
    order: list  # [(layer, head)] least important first: the order heads are removed in
    points: list  # [(heads removed, loss in nats)], the first with none removed

    @property
    def base(self) -> float:
        return self.points[0][1]

    def can_go(self, rise: float) -> tuple[int, int | None]:
        """(the most heads removed at a point where the loss, and every point's before it, rose
        by at most `rise`; the next point, where it rose more, or None)."""
        last = 0
        for removed, loss in self.points:
            if loss > self.base * (1 + rise):
                return last, removed
            last = removed
        return last, None


def batches(model, texts: list[str], tokens: int) -> list[list]:
    """The sentences' token ids in batches of equal length, about `tokens` tokens each."""
    from mha_trace.models.sentence import equal_lengths

    ids = [model.tokenize(text) for text in texts]
    return [[ids[i] for i in chunk] for chunk in equal_lengths([len(x) for x in ids], tokens)]


def _sentence_losses(model, rows: list, gates: list, grad: bool = False) -> torch.Tensor:
    """(B,) each sentence's mean next-token loss with head h of layer l scaled by gates[l][:, h]."""
    from mha_trace.core.ablation import heads_gated

    with heads_gated({model.attention_module(l + 1): (lambda _, g=g: g) for l, g in enumerate(gates)}):
        hidden, _, _ = model.run(rows, grad=grad)
    B, T, D = hidden.shape
    logits = model.unembed(hidden[:, :-1].reshape(-1, D))  # position p predicts token p + 1
    targets = torch.tensor([r[1:] for r in rows], device=logits.device).reshape(-1)
    loss = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    return loss.view(B, T - 1).mean(1)


def corpus_losses(model, found: list, removed: list, on_pass=lambda: None) -> list[float]:
    """The mean next-token loss over every predicted token, once for each list of heads in
    `removed` with those heads gone. The lists share the passes: a pass holds copies of one batch
    of sentences, each copy with its own gates, up to PASS_TOKENS tokens (the corpus's sentences
    are short, and one pass of many rows keeps the cores busier than many passes of few)."""
    gates = torch.ones(len(removed), model.layers, model.heads)  # (curve points, layers, heads)
    for point, heads in enumerate(removed):
        for layer, head in heads:
            gates[point, layer - 1, head - 1] = 0.0
    total, count = torch.zeros(len(removed), dtype=torch.float64, device=model.device), 0
    with torch.no_grad():
        for rows in found:
            B, T = len(rows), len(rows[0])
            step = max(1, PASS_TOKENS // (B * T))  # curve points a pass
            for first in range(0, len(removed), step):
                some = gates[first:first + step]  # (P, layers, heads)
                per_row = some.repeat_interleave(B, dim=0).transpose(0, 1)  # (layers, P·B, heads)
                losses = _sentence_losses(model, rows * len(some), list(per_row))
                total[first:first + len(some)] += losses.view(len(some), B).double().sum(1) * (T - 1)
            count += B * (T - 1)
            on_pass()
    return (total / count).tolist()


def importance(model, texts: list[str], on_batch=lambda: None) -> tuple[np.ndarray, float]:
    """(layers, heads): E over sentences of |∂ loss / ∂ gate|, each layer normalised to unit
    L2 norm (Michel et al. 2019, section 4.1 and 4.2). Each sentence of a batch has its own
    gates, so one backward pass gives every sentence's gradient. With it, the whole model's mean
    next-token loss over every predicted token, which the same passes give (the curve's first
    point)."""
    score = torch.zeros(model.layers, model.heads, dtype=torch.float64)
    n, total, count = 0, 0.0, 0
    for rows in batches(model, texts, GRAD_TOKENS):
        gates = torch.ones(model.layers, len(rows), model.heads, requires_grad=True)
        losses = _sentence_losses(model, rows, list(gates), grad=True)
        losses.sum().backward()
        score += gates.grad.abs().double().sum(1)
        total += float(losses.detach().double().sum()) * (len(rows[0]) - 1)
        n, count = n + len(rows), count + len(rows) * (len(rows[0]) - 1)
        on_batch()
    score /= n
    return (score / score.norm(dim=1, keepdim=True).clamp_min(1e-30)).numpy(), total / count


def prune(model: LanguageModel, corpus, on_step=lambda: None) -> Pruning:
    """Rank every head, then the corpus loss with the least important removed at each point of
    the curve (`on_step()` after each batch of the ranking and each batch of the curve)."""
    from mha_trace.speedups import batch_work

    check_prunable(model)
    with model.resident(), batch_work():
        scores, whole = importance(model, corpus.sentences, on_step)
        ranked = np.argsort(scores, axis=None, kind="stable")
        order = [(int(i // model.heads) + 1, int(i % model.heads) + 1) for i in ranked]
        found = batches(model, corpus.sentences, PASS_TOKENS)
        counts = sorted({round(f * len(order)) for f in FRACTIONS})
        some = [k for k in counts if k]  # none removed: the whole model, as the ranking ran it
        losses = {0: whole} | dict(zip(some, corpus_losses(model, found, [order[:k] for k in some],
                                                           on_step)))
        points = [(k, losses[k]) for k in counts]
    tokens = sum(len(rows) * (len(rows[0]) - 1) for rows in found)
    return Pruning(ModelCard.of(model), corpus.name, tokens, scores, order, points)


def check_prunable(model: AttentionModel) -> None:
    """Only a model trained to predict the next token has a next-token loss to prune by."""
    if not model.capabilities.causal:
        raise MhaError(f"pruning measures the next-token loss, and {model.name} is an encoder "
                       f"with no next token (try --model smollm2)", quantity="prune")
    if model.capabilities.trained_run:  # a run of mha-trace train predicts its task's targets
        raise MhaError(f"pruning measures the next-token loss, and {model.name} was trained to "
                       f"predict its task's targets, not the next token (ablate --rank removes "
                       f"each of its heads on the probe)", quantity="prune")


def steps(model, corpus) -> int:
    """How many times prune() calls on_step: for a progress bar."""
    return len(batches(model, corpus.sentences, GRAD_TOKENS)) + len(
        batches(model, corpus.sentences, PASS_TOKENS))
