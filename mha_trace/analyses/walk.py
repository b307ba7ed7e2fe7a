"""One token's walk through every head: each q·k written out, ÷√d_k, the softmax, Σ w·v, the
concatenation and W_O, computed by hand in NumPy (float64) from a `LectureHeads`. Plain data.
"""

import math
from dataclasses import dataclass

import numpy as np

from mha_trace.analyses.analysis import Heads, LectureHeads
from mha_trace.records import Shows


@dataclass
class KeyTerm:
    token: str
    products: list  # [(q_d, k_d), ...] for d in the head's dims
    dot: float
    scaled: float
    masked: bool
    weight: float
    moved: float | None = None  # with --effect: ‖f_h(x_j)‖, the key's value through W_O
    effect: float | None = None  # with --effect: weight × moved, renormalised
    capped: float | None = None  # soft-capping: c·tanh(scaled / c), what the softmax took
    bias: float | None = None  # ALiBi: what was added to the scaled score
    second: tuple | None = None  # differential attention: (its dot, scaled, map 1's weight, map 2's)
    parts: tuple | None = None  # MLA: (content q_C·k_C, position q_R·k_R), their sum the dot


@dataclass
class HeadWalk:
    head: int  # 1-based, as the chapter numbers them
    dims: tuple  # (start, end) of the head's columns in Q and the concatenation
    kv_head: int  # 1-based
    query: np.ndarray  # (d_k,)
    terms: list[KeyTerm]
    values: np.ndarray  # (T, d_k): the value rows this head mixes
    output: np.ndarray  # (d_k,)
    sink: tuple | None = None  # (its logit, its weight): the softmax's column that no key stands behind


@dataclass
class Walk(Shows):
    view: LectureHeads
    position: int
    sqrt_dk: float
    heads: list[HeadWalk]
    concat: np.ndarray  # (D,)
    output: np.ndarray  # (D,)
    only: int | None = None  # the head shown when none is asked for (None: every head)
    why: list | None = None  # --why: each head's scores split by source (analyses.why.Why)

    @property
    def token(self) -> str:
        return self.view.tokens[self.position]


@dataclass
class ModuleWalk(Shows):
    """One query of the user's module: its weights from the softmax on, a row per head (the
    module's projections are its own); with --why, its scores split into their dims."""

    view: Heads
    position: int
    only: int | None = None
    why: list | None = None


def walk(view: LectureHeads, position: int) -> Walk:
    """One token through every head, each number computed by hand (numpy, float64).

    The tests check that these weights equal the module's own: the walk-through describes the
    computation that ran, not a parallel one.
    """
    d_k, i, cap = view.d_k, position, view.config.scoring.softcap
    sqrt_dk = math.sqrt(d_k if view.latent is None else view.latent.d_h + view.latent.rope)
    heads = []
    for h in range(view.heads):
        if view.latent is not None:
            heads.append(_latent(view, h, i, sqrt_dk))
            continue
        g = view.kv_head_of(h)
        qs = view.q[i, h * d_k:(h + 1) * d_k]
        ks = view.k[:, g * d_k:(g + 1) * d_k]
        vs = view.v[:, g * d_k:(g + 1) * d_k]
        dots = ks @ qs
        scaled = dots / sqrt_dk
        bias = np.zeros_like(scaled) if view.bias is None else view.bias[h, i]  # ALiBi's
        capped = scaled + bias if cap is None else cap * np.tanh((scaled + bias) / cap)  # soft-capping
        allowed = np.ones(len(dots), bool) if view.mask is None else view.mask[i]
        if view.lam is not None:
            heads.append(_differential(view, h, g, qs, ks, vs, allowed))
            continue
        sink = None if view.sink is None else float(view.sink[h])
        weights, sink_weight = _softmax(capped, allowed, sink)
        moved, effect = _moved(view, h, vs, weights)
        terms = [KeyTerm(t, list(zip(qs.tolist(), ks[j].tolist())), float(dots[j]),
                         float(scaled[j]), not allowed[j], float(weights[j]),
                         *((None, None) if moved is None else (float(moved[j]), float(effect[j]))),
                         capped=None if cap is None else float(capped[j]),
                         bias=None if view.bias is None else float(bias[j]))
                 for j, t in enumerate(view.tokens)]
        heads.append(HeadWalk(h + 1, (h * d_k, (h + 1) * d_k), g + 1, qs, terms, vs, weights @ vs,
                              None if sink is None else (sink, sink_weight)))
    concat = np.concatenate([hw.output for hw in heads])
    output = concat @ view.W_O + (0 if view.b_O is None else view.b_O)
    return Walk(view, i, sqrt_dk, heads, concat, output)


def _differential(view: LectureHeads, h: int, g: int, qs, ks, vs, allowed) -> HeadWalk:
    """Differential attention's head h by hand: a softmax from each half of q and k (scaled by
    √(d_k/2)), the second taken away λ times, Σ w·v RMS-normed and times 1 - λ_init."""
    half, (lam, lam_init) = view.d_k // 2, view.lam
    maps = []
    for part in (slice(0, half), slice(half, None)):
        dots = ks[:, part] @ qs[part]
        maps.append((dots, dots / math.sqrt(half), _softmax(dots / math.sqrt(half), allowed, None)[0]))
    (dots, scaled, first), (dots_2, scaled_2, second) = maps
    weights = first - lam * second
    mixed = weights @ vs
    output = (1 - lam_init) * mixed / math.sqrt((mixed ** 2).mean() + 1e-5)
    terms = [KeyTerm(t, list(zip(qs[:half].tolist(), ks[j, :half].tolist())), float(dots[j]), float(scaled[j]),
                     not allowed[j], float(weights[j]),
                     second=(float(dots_2[j]), float(scaled_2[j]), float(first[j]), float(second[j])))
             for j, t in enumerate(view.tokens)]
    return HeadWalk(h + 1, (h * view.d_k, (h + 1) * view.d_k), g + 1, qs, terms, vs, output)


def _latent(view: LectureHeads, h: int, i: int, sqrt_dk: float) -> HeadWalk:
    """MLA's head h by hand: each key's score split into its content part (q_C·k_C, or absorbed
    (W_UKᵀ q_C)·c) and its RoPE part (q_R·k_R), their sum ÷ √(d_h + d_R), the softmax, Σ w·v."""
    parts, d_k = view.latent, view.d_k
    qs = view.q[i, h * parts.width:(h + 1) * parts.width]
    ks = view.k if parts.absorbed else view.k[:, h * parts.width:(h + 1) * parts.width]
    vs = view.v[:, h * d_k:(h + 1) * d_k]
    content, position = ks[:, :parts.content] @ qs[:parts.content], ks[:, parts.content:] @ qs[parts.content:]
    dots = content + position
    allowed = np.ones(len(dots), bool) if view.mask is None else view.mask[i]
    weights, _ = _softmax(dots / sqrt_dk, allowed, None)
    moved, effect = _moved(view, h, vs, weights)
    terms = [KeyTerm(t, list(zip(qs.tolist(), ks[j].tolist())), float(dots[j]), float(dots[j] / sqrt_dk),
                     not allowed[j], float(weights[j]),
                     *((None, None) if moved is None else (float(moved[j]), float(effect[j]))),
                     parts=(float(content[j]), float(position[j])))
             for j, t in enumerate(view.tokens)]
    return HeadWalk(h + 1, (h * d_k, (h + 1) * d_k), h + 1, qs, terms, vs, weights @ vs)


def _softmax(logits: np.ndarray, allowed: np.ndarray, sink: float | None) -> tuple:
    """The weights over the allowed keys, by hand, and the sink's share: with a sink logit the
    softmax runs over one more column, which no value stands behind (None: no sink)."""
    weights = np.zeros_like(logits)
    kept = logits[allowed]
    if sink is None and not allowed.any():
        return weights, None
    top = max(kept.max(initial=-np.inf), -np.inf if sink is None else sink)
    e = np.exp(kept - top)
    e_sink = 0.0 if sink is None else math.exp(sink - top)
    total = e.sum() + e_sink
    weights[allowed] = e / total
    return weights, None if sink is None else e_sink / total


def _moved(view: LectureHeads, h: int, vs: np.ndarray, weights: np.ndarray):
    """With the view's effect weights asked for: each key's ‖v_j · W_O block of head h‖ and the
    query's effect weights, by hand; (None, None) otherwise."""
    if view.effect is None:
        return None, None
    moved = np.linalg.norm(vs @ view.W_O[h * view.d_k:(h + 1) * view.d_k], axis=1)
    total = (weights * moved).sum()
    return moved, weights * moved / total if total > 0 else np.zeros_like(weights)
