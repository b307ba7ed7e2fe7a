"""`verify --latent`: the lecture's MLA module against references it does not compute itself: the
naive form in NumPy by hand (float64), the module's other form (absorbed against naive: DeepSeek-V2
§2.1.2 says they are equal), and F.scaled_dot_product_attention on each head's whole key."""

import math

import numpy as np
import torch
import torch.nn.functional as F

from mha_trace.analyses.references import TOLERANCE, Check, _max_abs, numpy_rope
from mha_trace.runs.run import check_finite


def numpy_latent(m, x, keep) -> tuple:
    """MLA by hand in float64 from the module's weights, the naive way: (output, weights)."""
    w = lambda layer: layer.weight.detach().double().cpu().numpy()
    X = x.detach().double().cpu().numpy()
    B, T, H, d_h, d_r, d_c = X.shape[0], X.shape[1], m.heads, m.nope_dim, m.rope_dim, m.kv_rank
    q = (X @ w(m.W_q).T).reshape(B, T, H, d_h + d_r).transpose(0, 2, 1, 3)
    down = X @ w(m.W_dkv).T
    c = down[..., :d_c] / np.sqrt((down[..., :d_c] ** 2).mean(-1, keepdims=True) + 1e-6) * w(m.kv_norm)
    k_r = numpy_rope(down[:, None, :, d_c:], m.rope_base)  # (B, 1, T, d_R): one for every head
    k_c = (c @ w(m.W_uk).T).reshape(B, T, H, d_h).transpose(0, 2, 1, 3)
    v = (c @ w(m.W_uv).T).reshape(B, T, H, m.v_dim).transpose(0, 2, 1, 3)
    scores = (q[..., :d_h] @ k_c.transpose(0, 1, 3, 2) + numpy_rope(q[..., d_h:], m.rope_base) @ k_r.transpose(0, 1, 3, 2))
    scores = scores / math.sqrt(d_h + d_r)
    if keep is not None:
        scores = np.where(keep, scores, -np.inf)
    e = np.exp(scores - scores.max(-1, keepdims=True))
    weights = e / e.sum(-1, keepdims=True)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(B, T, H * m.v_dim)
    return context @ w(m.W_o).T, weights


def sdpa_latent(m, x, mask):
    """Each head's whole query [q_C, q_R] and key [k_C, k_R] made with torch ops, then one
    F.scaled_dot_product_attention call (its default scale is 1/√(d_h + d_R), MLA's)."""
    B, T, H = x.size(0), x.size(1), m.heads
    with torch.no_grad():
        q = m.W_q(x).view(B, T, H, -1).transpose(1, 2)
        down = m.W_dkv(x)
        c, k_r = m.kv_norm(down[..., :m.kv_rank]), down[..., m.kv_rank:]
        turn = lambda t: torch.from_numpy(numpy_rope(t.double().cpu().numpy(), m.rope_base)).to(x)
        q = torch.cat([q[..., :m.nope_dim], turn(q[..., m.nope_dim:])], dim=-1)
        k_c = m.W_uk(c).view(B, T, H, m.nope_dim).transpose(1, 2)
        k = torch.cat([k_c, turn(k_r[:, None]).expand(B, H, T, m.rope_dim)], dim=-1)
        v = m.W_uv(c).view(B, T, H, m.v_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return m.W_o(out.transpose(1, 2).reshape(B, T, H * m.v_dim))


def latent_checks(m, x, k, v, mask, dtype: str) -> list[Check]:
    """The references for MLA (`check_references`'s checks_of): x is its one input (k and v are x)."""
    with torch.no_grad():
        out, weights = m(x, mask=mask)
        m.absorbed = not m.absorbed
        other_out, other_w = m(x, mask=mask)
        m.absorbed = not m.absorbed
    check_finite(out, weights)
    np_out, np_w = numpy_latent(m, x, None if mask is None else mask.cpu().numpy())
    scale = TOLERANCE[dtype] * max(1.0, float(np.abs(np_out).max()))
    other = "the naive form (keys and values made)" if m.absorbed else "the absorbed form (W_UK, W_UV folded in)"
    return [Check("numpy by hand, float64", "output", _max_abs(out, np_out), scale, "the naive form"),
            Check("numpy by hand, float64", "per-head weights", _max_abs(weights, np_w), TOLERANCE[dtype]),
            Check(other, "output", _max_abs(out, other_out), scale, "the same module, the other way"),
            Check(other, "per-head weights", _max_abs(weights, other_w), TOLERANCE[dtype]),
            Check("F.scaled_dot_product_attention", "output", _max_abs(out, sdpa_latent(m, x, mask)), scale,
                  "each head's key [k_C, k_R], RoPE turned in numpy")]
