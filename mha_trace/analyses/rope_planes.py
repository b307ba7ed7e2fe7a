"""A query's scores split by RoPE's rotation planes (`explain --rope-planes`): with the
rotate-half pairing, dims i and i + d_k/2 of q and k turn together by position · θ_i,
θ_i = base^(−2i/d_k), so q·k is a sum over the d_k/2 planes, each with its own frequency. Every
head turns every frequency: the frequency belongs to a pair of dims, not to a head. Computed in
NumPy (float64) from a walk's own turned q and k; the parts add up to the score. Plain data.
"""

import math
from dataclasses import dataclass

import numpy as np

from mha_trace.analyses.walk import Walk
from mha_trace.errors import MhaError
from mha_trace.records import Shows

MAX_KEYS = 6  # key columns a table or slide shows (the most-weighted ones); JSON has every key


@dataclass
class PlaneHead:
    head: int  # 1-based
    parts: np.ndarray  # (planes, keys): each plane's share of q·k ÷ √d_k, as turned
    unturned: np.ndarray  # (planes, keys): the same pairs' product before either was turned
    scores: np.ndarray  # (keys,) the scaled scores: each column of `parts` summed
    weights: np.ndarray  # (keys,)
    masked: list  # (keys,) bool


@dataclass
class RopePlanes(Shows):
    walk: Walk
    base: float
    frequencies: np.ndarray  # (planes,) θ_i in radians per token
    distances: np.ndarray  # (keys,) query position − key position
    heads: list

    @property
    def tokens(self) -> tuple:
        return self.walk.view.tokens


def rope_planes(w: Walk, head: int | None = None) -> RopePlanes:
    """Split each head's scores of the walk's query by rotation plane (`head`: that one only)."""
    config = w.view.config
    if not config.rope:
        raise MhaError("--rope-planes splits scores that RoPE turned: add --rope (or a model "
                       "with RoPE, such as smollm2)", quantity="rope_planes")
    d_k = config.d_k
    half = d_k // 2
    if half > 8 and (head or w.only) is None and len(w.heads) > 1:
        raise MhaError(f"--rope-planes shows {half} planes a head: pick one head with --head "
                       f"(e.g. --head {w.view.head_name(1)})", quantity="rope_planes")
    frequencies = config.rope_base ** (-np.arange(half) * 2.0 / d_k)
    positions = np.arange(len(w.view.tokens))
    heads = [_head(hw, w.position, positions, frequencies, half, w.sqrt_dk) for hw in w.heads]
    return RopePlanes(w, config.rope_base, frequencies, w.position - positions, heads)


def _turn(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """Turn each pair (x_i, x_{i+d/2}) of x (..., d) by its angle (..., d/2), rotate-half style."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


def _head(hw, position: int, positions, frequencies, half: int, sqrt_dk: float) -> PlaneHead:
    q = np.asarray(hw.query, float)  # (d_k,) as turned
    k = np.array([[kd for _, kd in t.products] for t in hw.terms])  # (keys, d_k) as turned
    pair = lambda a, b: (a[..., :half] * b[..., :half] + a[..., half:] * b[..., half:]) / sqrt_dk
    parts = pair(q[None], k).T  # (planes, keys)
    q0 = _turn(q, -position * frequencies)  # back to where each was before RoPE
    k0 = _turn(k, -positions[:, None] * frequencies[None])
    unturned = pair(q0[None], k0).T
    return PlaneHead(hw.head, parts, unturned, parts.sum(axis=0),
                     np.array([t.weight for t in hw.terms]), [t.masked for t in hw.terms])


def wavelength(theta: float) -> float:
    """Tokens for one full turn of a plane: 2π / θ."""
    return 2 * math.pi / theta


def shown_keys(t: RopePlanes, h) -> list:
    """The keys a head's table shows: every one the query sees, or its MAX_KEYS heaviest."""
    seen = [j for j, masked in enumerate(h.masked) if not masked]
    heaviest = sorted(seen, key=lambda j: -h.weights[j])[:MAX_KEYS]
    return sorted(heaviest)
