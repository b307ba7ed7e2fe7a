"""`explain --why`: each key's score split by where its query and key vectors come from.

A score is q_i · k_j / √d_k. Write q_i and k_j as sums of parts (a config: the head's dims, the
products the chapter writes out; a model: the sources of `models.stream`, each through W_q or W_k,
the projection's bias among the biases, RoPE turning each part as it turns q and k) and the score
is the sum of one term per (query part, key part) pair. A source's share of a score is its own
pair plus half of every pair it makes with another source, so the shares add up to the score; and
"without it" removes every term the source takes part in and takes the softmax again.
"""

import math
from dataclasses import dataclass

import numpy as np

from mha_trace.errors import MhaError


@dataclass
class Why:
    """One head's scores for one query, split by source (heads from 1)."""

    head: int
    sources: list  # names: "dim 2", or "token", "position", "L3 attention", "L3.H5", "biases"
    pairs: np.ndarray  # (S, S, T): the part of each key's score from (query source, key source)
    score: np.ndarray  # (T,) the scaled score before the mask, as the walk computed it
    allowed: np.ndarray  # (T,) bool: the keys the query may look at

    @property
    def parts(self) -> np.ndarray:
        """(S, T): each source's share of every key's score (they sum to the score)."""
        return 0.5 * (self.pairs.sum(1) + self.pairs.sum(0))

    def terms_of(self, s: int) -> np.ndarray:
        """(T,) every term source s takes part in, on the query side or the key's."""
        return self.pairs[s].sum(0) + self.pairs[:, s].sum(0) - self.pairs[s, s]

    def weights(self, score: np.ndarray | None = None) -> np.ndarray:
        """The softmax over the allowed keys of `score` (default: the real one)."""
        score = self.score if score is None else score
        out = np.zeros_like(score)
        if self.allowed.any():
            e = np.exp(score[self.allowed] - score[self.allowed].max())
            out[self.allowed] = e / e.sum()
        return out

    def without(self, s: int) -> np.ndarray:
        """(T,) the weights with source s's terms taken out of every score."""
        return self.weights(self.score - self.terms_of(s))

    def shift(self, s: int) -> float:
        """How far removing source s moves the weights: half the L1 distance, from 0 to 1."""
        return float(0.5 * np.abs(self.without(s) - self.weights()).sum())


def config_why(view, position: int, heads: list) -> list[Why]:
    """A config's heads (from 1): the sources are the head's dims, each the product q_d · k_d."""
    d_k, out = view.d_k, []
    for h in heads:
        g = view.kv_head_of(h - 1)
        q = view.q[position, (h - 1) * d_k:h * d_k]
        k = view.k[:, g * d_k:(g + 1) * d_k]
        pairs = np.zeros((d_k, d_k, len(k)))
        pairs[np.arange(d_k), np.arange(d_k)] = (q[:, None] * k.T) / math.sqrt(d_k)
        out.append(_why(view, h, [f"dim {(h - 1) * d_k + d}" for d in range(d_k)], pairs,
                        position))
    return out


def model_why(run, view, position: int, heads: list, by_head: bool = False) -> list[Why]:
    """A model's layer (`run`, `view` = its LectureHeads): the stream's sources through W_q and
    W_k (and RoPE) of each head asked for (from 1)."""
    import torch

    from mha_trace.core.attention import rope
    from mha_trace.models.stream import stream_parts

    a, s = run.module, run.sentence
    parts = stream_parts(s.model, s.ids, run.layer, by_head)
    names = list(parts) + ([] if "biases" in parts or a.W_q.bias is None else ["biases"])
    X = torch.stack([parts.get(n, torch.zeros_like(parts[names[0]])) for n in names])  # (S, T, D)
    d, out = a.d_k, []
    with torch.no_grad():
        for h in heads:
            g = view.kv_head_of(h - 1)
            Q, K = (projected(W, X, rows, names) for W, rows in
                    ((a.W_q, slice((h - 1) * d, h * d)), (a.W_k, slice(g * d, (g + 1) * d))))
            if a.rope:  # each part turned by its token's position, as q and k are
                Q, K = (rope(t[:, None], 0, a.rope_base)[:, 0] for t in (Q, K))
            pairs = torch.einsum("sd,tjd->stj", Q[:, position], K) / math.sqrt(d)
            out.append(_why(view, h, names, pairs.cpu().numpy(), position))
    return out


def module_why(run, view, position: int, heads: list) -> list[Why]:
    """A module of your own: the first product in its forward whose result is (..., T, T) and
    whose softmax (÷ √d_k, masked) gives the weights the module returned is taken for its scores,
    q·k, and split into the head's dims. A T×T product before it (a helper matrix, a mask made
    by a product) is passed over."""
    if run.numpy or view.averaged:
        what = "a NumPy module" if run.numpy else "a module that averages its heads' weights"
        raise MhaError(f"needs each head's q and k, which {what} does not show; explain --why "
                       f"runs on a config or a --model", quantity="why")
    closest = None
    for Q, KT in _scores_operands(run, len(view.tokens), view.heads):
        found, off = _split(view, Q, KT, position, heads)
        if found is not None:
            return found
        closest = off if closest is None else min(closest, off)
    raise MhaError(f"no T×T product in {run.label}'s forward is where its weights come from (the "
                   f"closest, its softmax ÷ √d_k, differs from them by {closest:.2g}), so --why "
                   f"cannot split them; verify --module compares it with the lecture's module",
                   quantity="why")


def _split(view, Q, KT, position: int, heads: list) -> tuple:
    """(each head's score split into its dims, 0) where these operands give the weights the
    module returned; else (None, how far the nearest head's weights are from them)."""
    if Q.shape[0] < max(heads) or KT.shape[-1] != len(view.tokens) or Q.shape[-1] != KT.shape[-2]:
        return None, math.inf
    d_k, out = Q.shape[-1], []
    for h in heads:
        pairs = np.zeros((d_k, d_k, KT.shape[-1]))
        pairs[np.arange(d_k), np.arange(d_k)] = Q[h - 1, position][:, None] * KT[h - 1] / math.sqrt(d_k)
        allowed = np.ones(KT.shape[-1], bool) if view.mask is None else np.asarray(view.mask[position], bool)
        why = Why(h, [f"dim {(h - 1) * d_k + d}" for d in range(d_k)], pairs, pairs.sum((0, 1)), allowed)
        off = float(np.abs(why.weights() - view.weights[h - 1, position]).max())
        if not off <= 1e-4:  # NaN too
            return None, off
        out.append(why)
    return out, 0.0


CANDIDATES = 64  # T×T products of a forward tried as its q·k, in order


def _scores_operands(run, T: int, heads: int) -> list:
    """Each candidate (Q (heads, T, d_k), Kᵀ (heads, d_k, T)) of the first batch item, in order:
    from each matrix product of the module's forward whose result is (..., T, T)."""
    import torch
    from torch.overrides import TorchFunctionMode

    from mha_trace.runs import usermodule

    products = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm}
    found: list = []

    class Scores(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if (len(found) < 4096 and func in products and len(args) == 2
                    and isinstance(out, torch.Tensor) and out.dim() >= 2
                    and tuple(out.shape[-2:]) == (T, T)):
                found.append([a.detach().double().cpu() for a in args])
            return out

    with usermodule.user_code(f"{run.label}: forward"), Scores():
        run.forward()
    if not found:
        raise MhaError(f"{run.label}'s forward computes no T×T product of two tensors (its q·k), "
                       f"so --why cannot split its scores", quantity="why")
    batch = run.args[0].shape[0] if run.args[0].dim() == 3 else 1
    candidates = []
    for start in range(min(len(found), CANDIDATES)):
        try:
            candidates.append(_heads_of(found[start:], T, heads, batch))
        except RuntimeError:  # products of other shapes (a helper, a loop's last heads)
            continue
    return candidates


def _heads_of(found: list, T: int, heads: int, batch: int) -> tuple:
    """(Q, Kᵀ) of batch item 0, one row a head: from the first T×T product when it holds every
    head (B, H, T, T); else (a loop over heads, or over the batch and then the heads, with the
    K/V heads broadcast) from the first `heads` products, the first batch item of each."""
    import torch

    def one(a, b):
        if a.dim() == b.dim():  # K/V heads broadcast over their group of query heads
            lead = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
            a, b = a.expand(*lead, *a.shape[-2:]), b.expand(*lead, *b.shape[-2:])
        return a.reshape(-1, T, a.shape[-1]), b.reshape(-1, b.shape[-2], T)

    a, b = one(*found[0])
    if a.shape[0] >= batch * heads or len(found) < heads:
        return a.numpy(), b.numpy()
    pairs = [one(*f) for f in found[:heads]]
    return (torch.stack([p[0][0] for p in pairs]).numpy(),
            torch.stack([p[1][0] for p in pairs]).numpy())


def projected(W, X, rows: slice, names: list):
    """(S, T, d_k): each source's part through these rows of W; the bias goes to "biases"."""
    out = X @ W.weight.double()[rows].T
    if W.bias is not None:
        out[names.index("biases")] += W.bias.double()[rows]
    return out


def _why(view, h: int, sources: list, pairs: np.ndarray, position: int) -> Why:
    g = view.kv_head_of(h - 1)
    d_k = view.d_k
    score = view.k[:, g * d_k:(g + 1) * d_k] @ view.q[position, (h - 1) * d_k:h * d_k] / math.sqrt(d_k)
    allowed = np.ones(len(score), bool) if view.mask is None else np.asarray(view.mask[position], bool)
    return Why(h, sources, pairs, score, allowed)


def with_why(walk, run, head: int | None = None, by_head: bool = False):
    """The walk with its heads' scores split (`explain --why`): `head` (from 1), or every one."""
    from dataclasses import replace

    head = head or walk.only
    heads = [head] if head else [hw.head for hw in walk.heads]
    if run.sentence is None and by_head:
        raise MhaError("--by-head splits a model's earlier layers into their heads; a config's "
                       "scores split into the head's dims", quantity="by_head")
    found = (model_why(run, walk.view, walk.position, heads, by_head) if run.sentence is not None
             else config_why(walk.view, walk.position, heads))
    return replace(walk, why=found)
