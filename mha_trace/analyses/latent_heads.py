"""What `heads` and `explain` read from a run of the lecture's MLA module (core.latent_attention):
each head's q and k as its score multiplies them, its content part and its RoPE part side by side.

A head's score is q_C·k_C + q_R·k_R, over √(d_h + d_R): the dot product of [q_C; q_R] with
[k_C; k_R]. In the absorbed form the content part is (W_UKᵀ q_C)·c, so every head scores the same
keys [c; k_R], one a token: the form a cache serves, and the same numbers.
"""

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LatentParts:
    """How an MLA head's q and k split, and the score's scale."""

    content: int  # the content part's dims: d_h (naive), d_c (absorbed: W_UKᵀ q_C against c)
    rope: int  # d_R: the RoPE part's dims
    d_h: int  # a head's query and key dims without position: the score is over √(d_h + d_R)
    absorbed: bool  # every head scores the same keys [c; k_R]

    @property
    def width(self) -> int:
        """A head's q (and k) as the walk multiplies them."""
        return self.content + self.rope


def latent_projections(module, x) -> tuple:
    """(q, k, v, parts) of one run on x (1, T, D): q (1, T, H·width), k (1, T, H·width; absorbed:
    (1, T, width), the keys every head shares), v (1, T, H·d_v), each as the module's forward
    multiplies them (its own methods compute them)."""
    B, T, H = x.size(0), x.size(1), module.heads
    with torch.no_grad():
        q_c, q_r = module.queries(x)  # (B, H, T, d_h), (B, H, T, d_R)
        c, k_r = module.latents(x)  # (B, T, d_c), (B, 1, T, d_R)
        if module.absorbed:
            q = torch.cat([module.absorb(q_c), q_r], dim=-1)  # (B, H, T, d_c + d_R)
            k = torch.cat([c[:, None], k_r], dim=-1)  # (B, 1, T, d_c + d_R)
        else:
            q = torch.cat([q_c, q_r], dim=-1)  # (B, H, T, d_h + d_R)
            k = torch.cat([module.keys(c), k_r.expand(B, H, T, module.rope_dim)], dim=-1)
        v = module.values(c)  # (B, H, T, d_v): Σ w·(W_UV c) = W_UV Σ w·c, as the absorbed form mixes
    flat = lambda t: t.transpose(1, 2).reshape(B, T, -1)
    parts = LatentParts(module.kv_rank if module.absorbed else module.nope_dim, module.rope_dim,
                        module.nope_dim, module.absorbed)
    return flat(q), flat(k), flat(v), parts
