"""Multi-head latent attention (MLA, DeepSeek-V2 §2.1), written out as the lecture module is.

Keys and values are not projected per head from the token: the token goes down to one latent c of
d_c dims (and one RoPE key of d_R dims that every head shares), and each head's key and value come
up from c. A cache keeps c and the RoPE key alone: d_c + d_R numbers a token and layer.

>>> mla = LatentAttention(d_model=64, heads=4, kv_rank=16, rope_dim=8)
>>> out, weights = mla(torch.randn(2, 10, 64))
>>> out.shape, weights.shape
(torch.Size([2, 10, 64]), torch.Size([2, 4, 10, 10]))

`absorbed=True` computes the same numbers the way inference does (§2.1.2): W_UK folded into each
head's query and W_UV applied after the weights, so no head's key or value is ever formed.
"""

import math

import torch
import torch.nn as nn

from mha_trace.core.attention import rope


class LatentAttention(nn.Module):
    """softmax((q_C·k_C + q_R·k_R) / √(d_h + d_R)) v, with k_C = W_UK c, v = W_UV c, k_R shared."""

    def __init__(self, d_model, heads, kv_rank, rope_dim, nope_dim=None, v_dim=None, rope_base=10000.0,
                 bias=False, absorbed=False):
        super().__init__()
        self.d_model, self.heads, self.kv_rank, self.rope_dim = d_model, heads, kv_rank, rope_dim
        self.nope_dim = nope_dim or d_model // heads  # d_h: a head's query and key dims without position
        self.v_dim = v_dim or d_model // heads  # d_v: a head's value dims
        self.rope_base, self.absorbed = rope_base, absorbed

        self.W_q = nn.Linear(d_model, heads * (self.nope_dim + rope_dim), bias=bias)  # queries, RoPE part too
        self.W_dkv = nn.Linear(d_model, kv_rank + rope_dim, bias=bias)  # down to c, and the shared RoPE key
        self.kv_norm = nn.RMSNorm(kv_rank, eps=1e-6)  # on the latent, as DeepSeek's layers have it
        self.W_uk = nn.Linear(kv_rank, heads * self.nope_dim, bias=False)  # up: each head's key
        self.W_uv = nn.Linear(kv_rank, heads * self.v_dim, bias=False)  # up: each head's value
        self.W_o = nn.Linear(heads * self.v_dim, d_model, bias=bias)

    def forward(self, x, mask=None):
        """x: (B, T, d_model); mask: bool (T, T), True where a query may look."""
        B, T, H = x.size(0), x.size(1), self.heads
        q_c, q_r = self.queries(x)  # (B, H, T, d_h), (B, H, T, d_R)
        c, k_r = self.latents(x)  # (B, T, d_c), (B, 1, T, d_R)

        if self.absorbed:
            # W_UK folded into the query: q_C·(W_UK c) = (W_UKᵀ q_C)·c, scored against c itself
            content = torch.matmul(self.absorb(q_c), c[:, None].transpose(-2, -1))  # (B, H, T, T)
        else:
            content = torch.matmul(q_c, self.keys(c).transpose(-2, -1))  # (B, H, T, T)

        # the score: its content part and its position part, over √(d_h + d_R)
        position = torch.matmul(q_r, k_r.transpose(-2, -1))  # (B, H, T, T)
        scores = (content + position) / math.sqrt(self.nope_dim + self.rope_dim)  # (B, H, T, T)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, T)

        if self.absorbed:
            # the weights mix the latents, then W_UV brings each head's mix up to its value dims
            mixed = torch.matmul(weights, c[:, None])  # (B, H, T, d_c)
            W_uv = self.W_uv.weight.view(H, self.v_dim, self.kv_rank)  # (H, d_v, d_c)
            context = torch.einsum("bhtc,hvc->bhtv", mixed, W_uv)  # (B, H, T, d_v)
        else:
            context = torch.matmul(weights, self.values(c))  # (B, H, T, d_v)

        # concatenate heads and mix them, as the lecture module does
        context = context.transpose(1, 2).contiguous().view(B, T, H * self.v_dim)  # (B, T, H·d_v)
        return self.W_o(context), weights

    def queries(self, x):
        """Each head's query: its content part q_C and its RoPE part q_R, turned."""
        B, T = x.size(0), x.size(1)
        q = self.W_q(x).view(B, T, self.heads, self.nope_dim + self.rope_dim).transpose(1, 2)  # (B, H, T, d_h + d_R)
        q_c, q_r = q.split([self.nope_dim, self.rope_dim], dim=-1)  # (B, H, T, d_h), (B, H, T, d_R)
        return q_c, rope(q_r, 0, self.rope_base)

    def latents(self, x):
        """Down: one latent c a token (what a cache keeps) and one RoPE key a token, shared by the heads."""
        c, k_r = self.W_dkv(x).split([self.kv_rank, self.rope_dim], dim=-1)  # (B, T, d_c), (B, T, d_R)
        return self.kv_norm(c), rope(k_r[:, None], 0, self.rope_base)  # (B, T, d_c), (B, 1, T, d_R)

    def keys(self, c):
        """Up: each head's key from c."""
        B, T = c.size(0), c.size(1)
        return self.W_uk(c).view(B, T, self.heads, self.nope_dim).transpose(1, 2)  # (B, H, T, d_h)

    def values(self, c):
        """Up: each head's value from c."""
        B, T = c.size(0), c.size(1)
        return self.W_uv(c).view(B, T, self.heads, self.v_dim).transpose(1, 2)  # (B, H, T, d_v)

    def absorb(self, q_c):
        """W_UKᵀ q_C: each head's query taken down to the latent's d_c dims."""
        W_uk = self.W_uk.weight.view(self.heads, self.nope_dim, self.kv_rank)  # (H, d_h, d_c)
        return torch.einsum("bhtd,hdc->bhtc", q_c, W_uk)  # (B, H, T, d_c)
