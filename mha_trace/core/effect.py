"""Attention weighted by what it moves (Kobayashi et al. 2020, "Attention is not only a weight").

Head h adds Σ_j α_ij f_h(x_j) to query i's output, where f_h(x_j) is token j's value vector for
that head (bias included) through the head's block of W_O. A large weight on a token whose f_h is
short moves almost nothing, so the effect weight of key j is

    α_ij ‖f_h(x_j)‖ / Σ_j' α_ij' ‖f_h(x_j')‖

Plain numpy; W_O as the lecture writes it, output = concat @ W_O (a `nn.Linear`'s weight, transposed).
"""

import numpy as np


def value_norms(v: np.ndarray, W_O: np.ndarray, heads: int, kv_heads: int) -> np.ndarray:
    """(..., heads, T): ‖f_h(x_j)‖ for every query head h and token j.

    v: (..., T, kv_heads · d_k) the projected values; W_O: (heads · d_k, D). Under grouped-query
    attention query head h reads K/V head h // (heads // kv_heads)."""
    d_k = W_O.shape[0] // heads
    V = v.reshape(*v.shape[:-1], kv_heads, d_k)  # (..., T, kv_heads, d_k)
    V = np.repeat(V, heads // kv_heads, axis=-2)  # (..., T, heads, d_k)
    V = np.moveaxis(V, -2, -3)  # (..., heads, T, d_k)
    blocks = W_O.reshape(heads, d_k, W_O.shape[1])  # (heads, d_k, D): head h's rows of W_O
    gram = blocks @ blocks.transpose(0, 2, 1)  # (heads, d_k, d_k): ‖v W‖² = v (W Wᵀ) vᵀ
    return np.sqrt(np.clip(((V @ gram) * V).sum(-1), 0, None))


def effect_weights(weights: np.ndarray, norms: np.ndarray) -> np.ndarray:
    """(..., heads, T, T) weights and (..., heads, T) value norms -> the effect weights: each
    query's row of α · ‖f(x_j)‖, summing to 1 (a row that moves nothing stays 0)."""
    moved = weights * norms[..., None, :]
    total = moved.sum(-1, keepdims=True)
    return np.divide(moved, total, out=np.zeros_like(moved), where=total > 0)
