"""The classic mistakes of a FlashAttention-2 forward written by hand (CS336's assignment 2): the
lecture's tiled walk (core.attention.tiled_attention, Dao 2023 Algorithm 1) written here as stages
on one head, (B, T, d), as a student writes it (every row has a key, so no row's max stays -inf), and
each mistake one or two of those stages done wrong. A student's (O, L)
that equals a mistake's is diagnosed as it, with its one-sentence fix."""

import math
from dataclasses import dataclass, field

import torch

INF = float("-inf")


@dataclass(frozen=True)
class TiledMistake:
    name: str
    fix: str
    stages: dict = field(default_factory=dict)
    causal_only: bool = False  # shows only under a causal mask


def _lse(m, l):
    return m + torch.log(l)


LECTURE = {  # each stage of the walk: the lecture's way
    "scale": lambda d: 1 / math.sqrt(d),
    "skip": lambda i, j, bq, bk: j > i + bq - 1,  # a key tile wholly after the query tile's last row
    "mask": lambda S, i, j: S.masked_fill(_after(S, i, j), INF),
    "m_new": lambda m, S: torch.maximum(m, S.amax(dim=-1)),
    "P": lambda S, m, m_new: torch.exp(S - m_new[..., None]),
    "values": lambda K_j, V_j: V_j,
    "rescale": lambda m, m_new: torch.exp(m - m_new),
    "l": lambda l, rescale, P: rescale * l + P.sum(dim=-1),
    "O": lambda O, rescale, P, V, l: rescale[..., None] * O + P @ V,
    "out": lambda O, l: O / l[..., None],  # causal or not, every row has a key: ℓ > 0
    "L": _lse,
}


def _after(S, i: int, j: int):
    """True where key j + c comes after query i + r (the causal mask of one tile)."""
    rows = torch.arange(S.size(-2))[:, None] + i
    cols = torch.arange(S.size(-1))[None, :] + j
    return cols > rows


MISTAKES = (
    TiledMistake("the running sum ℓ not rescaled", "rescale ℓ by exp(m_old - m_new) before adding the "
                 "tile's row sums: ℓ = exp(m_old - m_new)·ℓ + rowsum(P)", {"l": lambda l, r, P: l + P.sum(-1)}),
    TiledMistake("the output not rescaled", "rescale the output so far by exp(m_old - m_new) before adding "
                 "P·V: O = diag(exp(m_old - m_new))·O + P·V", {"O": lambda O, r, P, V, l: O + P @ V}),
    TiledMistake("the tile's weights applied to K instead of V", "multiply P by the value tile: O += P·V_j",
                 {"values": lambda K_j, V_j: K_j}),
    TiledMistake("the row sums taken over the queries (dim=-2)", "sum each row of P over its keys, the last "
                 "axis: P.sum(dim=-1)", {"l": lambda l, r, P: r * l + P.sum(dim=-2)}),
    TiledMistake("the logsumexp without m: L = log ℓ", "L = m + log ℓ: ℓ was summed after subtracting m",
                 {"L": lambda m, l: torch.log(l)}),
    TiledMistake("the logsumexp without its log: L = m + ℓ", "L = m + log ℓ",
                 {"L": lambda m, l: m + l}),
    TiledMistake("the final division by ℓ missing", "divide each row of the output by its ℓ once, after the "
                 "last key tile: O = O / ℓ", {"out": lambda O, l: O}),
    TiledMistake("divided by ℓ at every tile", "divide by ℓ once, after the last key tile; inside the loop the "
                 "output stays unnormalised", {"O": lambda O, r, P, V, l: r[..., None] * O + (P @ V) / l[..., None],
                                               "out": lambda O, l: O}),
    TiledMistake("the scores not scaled by 1/√d", "multiply each tile's scores Q_i·K_jᵀ by 1/√d",
                 {"scale": lambda d: 1.0}),
    TiledMistake("the rescale the wrong way round: exp(m_new - m_old)", "older terms shrink: multiply by "
                 "exp(m_old - m_new), which is at most 1", {"rescale": lambda m, m_new: torch.exp(m_new - m)}),
    TiledMistake("the diagonal key tile skipped (causal skipping off by one)", "skip a key tile only when its "
                 "first key comes after the query tile's last row: j > i + B_q - 1", {"skip": lambda i, j, bq, bk: j >= i},
                 causal_only=True),
    TiledMistake("no causal mask inside the diagonal tile", "inside a tile that straddles the diagonal, fill "
                 "with -inf where the key comes after the query", {"mask": lambda S, i, j: S}, causal_only=True),
    TiledMistake("the causal mask the wrong way round", "fill with -inf where the key comes AFTER the query "
                 "(col > row), not before", {"mask": lambda S, i, j: S.masked_fill(~_after(S, i, j), INF)},
                 causal_only=True),
)
FIXES = {m.name: m.fix for m in MISTAKES}


def tiled_forward(Q, K, V, causal: bool, bq: int, bk: int, stages: dict | None = None):
    """(O, L) of the walk on (B, T, d) float64, the lecture's or with `stages` in place."""
    s = {**LECTURE, **(stages or {})}
    B, T, d = Q.shape
    outputs, lses = [], []
    for i in range(0, T, bq):
        Q_i = Q[:, i:i + bq]
        m = torch.full(Q_i.shape[:-1], INF, dtype=torch.float64)
        l, O = torch.zeros(Q_i.shape[:-1], dtype=torch.float64), torch.zeros_like(Q_i)
        for j in range(0, K.size(1), bk):
            if causal and s["skip"](i, j, Q_i.size(1), bk):
                continue
            S = Q_i @ K[:, j:j + bk].transpose(-2, -1) * s["scale"](d)
            S = s["mask"](S, i, j) if causal else S
            m_new = s["m_new"](m, S)
            P, rescale = s["P"](S, m, m_new), s["rescale"](m, m_new)
            l = s["l"](l, rescale, P)
            O = s["O"](O, rescale, P, s["values"](K[:, j:j + bk], V[:, j:j + bk]), l)
            m = m_new
        outputs.append(s["out"](O, l))
        lses.append(s["L"](m, l))
    return torch.cat(outputs, dim=1), torch.cat(lses, dim=1)


def tiled_diagnoses(Q, K, V, causal: bool, bq: int, bk: int, O, L, atol: float) -> list[str]:
    """The known tiled mistakes whose (O, L) the student's equals (L only where it gave one)."""
    found = []
    for mistake in MISTAKES:
        if mistake.causal_only and not causal:
            continue
        with torch.no_grad(), torch.autograd.set_grad_enabled(False):
            mO, mL = tiled_forward(Q, K, V, causal, bq, bk, mistake.stages)
        same = lambda a, b: a.shape == b.shape and torch.allclose(a, b.double(), rtol=1e-5, atol=atol, equal_nan=True)
        if same(mO, O) and (L is None or same(mL, L)):
            found.append(mistake.name)
    return found
