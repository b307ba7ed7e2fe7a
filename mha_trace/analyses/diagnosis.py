"""The search for a known mistake: the lecture's forward run stage by stage with a mistake's
stages in place of its own (each mistake alone, then two at once), and the student's output held
against each. A stage computed on the same inputs is computed once (`Memo`)."""

import contextlib
from contextvars import ContextVar

import torch

from mha_trace.analyses.mistakes import BOTH, DIFF, KNOWN, LECTURE, Mistake
from mha_trace.core.attention import MultiHeadAttention


def _pairs():
    """Two mistakes at once, each in its own stage: what a module with two of them computes."""
    for i, a in enumerate(KNOWN):
        for b in KNOWN[i + 1:]:
            if not set(a.stages) & set(b.stages):
                yield Mistake(a.name + BOTH + b.name, "", {**a.stages, **b.stages}, a.needs + b.needs)


class Memo:
    """Stage results shared by the forwards tried on one input: a stage's function called on the
    same inputs again gives what it gave (the lecture's stages before a mistake's; a pair's, up to
    its second mistake, as its first mistake alone computed them). Each result keeps its inputs,
    so an input's id names that input for as long as the memo lives. A memo that only reads
    (`reading`) keeps nothing new: what a pair computes past its second mistake no other forward
    asks for, and kept for every pair it would hold hundreds of (B, H, T, T) score tensors."""

    def __init__(self, found: dict | None = None, keeps: bool = True):
        self.found, self.keeps = {} if found is None else found, keeps

    def reading(self) -> "Memo":
        return Memo(self.found, keeps=False)

    def __call__(self, stage: str, stages: dict, m, *inputs):
        function = stages[stage]
        key = (function, *map(id, inputs))
        if key in self.found:
            return self.found[key][0]
        result = function(m, *inputs)
        if self.keeps:
            self.found[key] = result, inputs
        return result


def _groups(m, Q, K, V):
    """K and V, each K/V head repeated for its group of query heads (grouped-query attention)."""
    if K.size(1) in (1, Q.size(1)) and not m.diff:
        return K, V
    return tuple(t.repeat_interleave(Q.size(1) // t.size(1), dim=1) for t in (K, V))


GROUPS = {"groups": _groups}
HALVES = {"halves": lambda m, Q, K: tuple(t.unflatten(-1, (2, -1)).transpose(2, 3) for t in (Q, K))}  # (B, n, 2, T, d/2)
DIFF_SOFTMAX = {"softmax": lambda m, s: torch.softmax(s, dim=-1)}
MAPS = {"maps": lambda m, maps: (maps[:, :, 0], maps[:, :, 1])}


def with_mistake(m: MultiHeadAttention, mistake: Mistake, q, k, v, mask, memo=None):
    """The lecture's forward, stage by stage, with the mistake's stages in place of its own."""
    s, at = {**LECTURE, **mistake.stages}, memo or Memo()
    Q, K, V = (at("split", s, m, at("project", s, m, x, layer)) for x, layer in zip((q, k, v), at("layers", s, m)))
    Q, K = at("norm", s, m, Q, K)
    Q, K, V = at("rope", s, m, Q, K, V)
    K, V = at("groups", GROUPS, m, Q, K, V)  # grouped-query: each K/V head serves a group of queries
    scores = at("mask", s, m, at("cap", s, m, at("bias", s, m, at("scale", s, m, at("scores", s, m, Q, K)))), mask)
    weights = at("after softmax", s, m, at("softmax", s, m, scores), mask)
    context = at("mix", s, m, weights, scores, K, V)
    return at("output", s, m, at("merge", s, m, context), q), weights


def with_differential(m: MultiHeadAttention, mistake: Mistake, q, k, v, mask, memo=None):
    """The lecture's differential attention, stage by stage, with the mistake's stages in place."""
    s, at = {**LECTURE, **DIFF, **mistake.stages}, memo or Memo()
    Q, K, V = (at("split", s, m, at("project", s, m, x, layer)) for x, layer in zip((q, k, v), at("layers", s, m)))
    Q, K = at("norm", s, m, Q, K)
    Q, K = at("halves", HALVES, m, Q, K)
    Q, K, V = at("rope", s, m, Q, K, V)
    K, V = at("groups", GROUPS, m, Q, K, V)
    maps = at("softmax", DIFF_SOFTMAX, m, at("mask", s, m, at("scale", s, m, at("scores", LECTURE, m, Q, K)), mask))
    weights = at("combine", s, m, *at("maps", MAPS, m, maps), at("lam", s, m))
    return at("output", s, m, at("merge", s, m, at("head norm", s, m, at("mix", LECTURE, m, weights, None, K, V))),
              q), weights


def _showable(reference, T: int, mask) -> set:
    """What a mistake may need that holds for this reference, input and mask (`Mistake.needs`)."""
    holds = {"mask": mask is not None, "no mask": mask is None, "rope": reference.rope,
             "bias": reference.W_q.bias is not None, "T = d_k": T == reference.d_k,
             "qk_norm": reference.qk_norm, "softcap": reference.softcap is not None,
             "sinks": reference.sinks is not None, "alibi": reference.alibi, "diff": reference.diff,
             "partial": reference.rope and (reference.rope_dims or reference.d_k) < reference.d_k,
             "relative_bias": reference.relative_bias}
    return {need for need, held in holds.items() if held}


def _can_show(mistake: Mistake, holds: set, diff: bool) -> bool:
    """Differential attention has mistakes of its own; any other shows where what it needs holds."""
    return diff == ("diff" in mistake.needs) and holds.issuperset(mistake.needs)


def _same(mistaken: torch.Tensor, output: torch.Tensor, atol: float) -> bool:
    """The student's output equals the mistake's wherever the mistake's is a number: a row whose
    every key the mistake masks is NaN with -inf, and whatever a -1e9 fill makes of it (uniform
    weights) tells nothing about which mistake it is."""
    known = ~torch.isnan(mistaken)
    if bool(known.all()):
        return mistaken.numel() > 0 and torch.allclose(mistaken, output, rtol=1e-6, atol=atol)
    return bool(known.any()) and torch.allclose(mistaken[known], output[known], rtol=1e-6, atol=atol)


def diagnoses(reference: MultiHeadAttention, x, mask, output: torch.Tensor,
              atol: float = 1e-9) -> list[str]:
    """The known mistakes whose output the student's output equals (at some sizes two give the
    same numbers: with d_model = 64 and 8 heads, √d_model is d_k); while `suspecting`, only those.

    x: the input (B, T, D), or the (q, k, v) tuple a config gives. atol: wider for a module that
    computes part of its work in a lower precision."""
    qkv = tuple(t.double() for t in (x if isinstance(x, tuple) else (x, x, x)))
    memo, output, only = Memo(), output.double(), SUSPECTS.get()  # a pair's stages to its second mistake: its first's
    suspected = lambda mistakes: (m for m in mistakes if only is None or m.name in only)
    return _matching(suspected(KNOWN), reference, qkv, mask, output, atol, memo) or \
        _matching(suspected(_pairs()), reference, qkv, mask, output, atol, memo.reading())[:1]  # none alone: two


SUSPECTS: ContextVar[frozenset | None] = ContextVar("suspects", default=None)


@contextlib.contextmanager
def suspecting(names):
    """While it lasts, `diagnoses` looks only for these mistakes (a diagnosis confirmed at a
    second size is looked for there, not searched for again among them all)."""
    token = SUSPECTS.set(frozenset(names))
    try:
        yield
    finally:
        SUSPECTS.reset(token)


def _matching(mistakes, reference, qkv: tuple, mask, output: torch.Tensor, atol: float, memo: Memo) -> list[str]:
    found, holds, (q, k, v) = [], _showable(reference, qkv[0].size(1), mask), qkv
    forward = with_differential if reference.diff else with_mistake
    for mistake in (m for m in mistakes if _can_show(m, holds, reference.diff)):
        try:
            with torch.no_grad():
                out, _ = forward(reference, mistake, q, k, v, mask, memo)
        except RuntimeError:
            continue
        if out.shape == output.shape and _same(out, output, atol):
            found.append(mistake.name)
    return found
