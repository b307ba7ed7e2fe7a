"""Students' multi-head latent attention (DeepSeek-V2's MLA), for `verify --module ... --latent 16
--rope-dim 8`: written as the paper writes it (W^DKV and W^KR apart) and as DeepSeek's code fuses it,
each right; and the paper's version with one step wrong."""

import math

import torch
import torch.nn as nn


def turned(x):
    """Rotate-half RoPE on x (..., T, d), base 10000."""
    T, d = x.size(-2), x.size(-1)
    inv_freq = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    angles = torch.cat([torch.arange(T, dtype=x.dtype)[:, None] * inv_freq] * 2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat([-x2, x1], dim=-1) * angles.sin()


class PaperMLA(nn.Module):
    """Equations (9)-(19) of DeepSeek-V2, without a query latent."""

    def __init__(self, d_model, num_heads, kv_rank, rope_dim):
        super().__init__()
        self.h, self.d_h, self.d_r = num_heads, d_model // num_heads, rope_dim
        self.W_Q = nn.Linear(d_model, num_heads * (self.d_h + rope_dim), bias=False)
        self.W_DKV = nn.Linear(d_model, kv_rank, bias=False)
        self.W_KR = nn.Linear(d_model, rope_dim, bias=False)
        self.norm = nn.RMSNorm(kv_rank, eps=1e-6)
        self.W_UK = nn.Linear(kv_rank, d_model, bias=False)
        self.W_UV = nn.Linear(kv_rank, d_model, bias=False)
        self.W_O = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q = self.W_Q(x).view(B, T, self.h, -1).transpose(1, 2)
        q_c, q_r = q[..., :self.d_h], turned(q[..., self.d_h:])
        c = self.latent(x)
        k_c = self.W_UK(c).view(B, T, self.h, self.d_h).transpose(1, 2)
        v = self.W_UV(c).view(B, T, self.h, self.d_h).transpose(1, 2)
        k_r = turned(self.W_KR(x))[:, None]
        s = self.scored(q_c, k_c, q_r, k_r)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(dim=-1)
        return self.W_O((w @ v).transpose(1, 2).reshape(B, T, D)), w

    def latent(self, x):
        return self.norm(self.W_DKV(x))

    def scored(self, q_c, k_c, q_r, k_r):
        return (q_c @ k_c.transpose(-2, -1) + q_r @ k_r.transpose(-2, -1)) / math.sqrt(self.d_h + self.d_r)


class FusedMLA(nn.Module):
    """As DeepSeek's code fuses it: one down-projection to [c; k_R], one up-projection to each head's
    [k_C; v] (kv_b_proj), the norm named as its layer."""

    def __init__(self, d_model, num_heads, kv_rank, rope_dim):
        super().__init__()
        self.h, self.d_h, self.d_c, self.d_r = num_heads, d_model // num_heads, kv_rank, rope_dim
        self.q_proj = nn.Linear(d_model, num_heads * (self.d_h + rope_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(d_model, kv_rank + rope_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_rank, eps=1e-6)
        self.kv_b_proj = nn.Linear(kv_rank, num_heads * 2 * self.d_h, bias=False)
        self.o_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q_c, q_r = self.q_proj(x).view(B, T, self.h, -1).transpose(1, 2).split([self.d_h, self.d_r], dim=-1)
        c, k_r = self.kv_a_proj_with_mqa(x).split([self.d_c, self.d_r], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(c)).view(B, T, self.h, 2 * self.d_h).transpose(1, 2)
        k_c, v = kv.split([self.d_h, self.d_h], dim=-1)
        k = torch.cat([k_c, turned(k_r)[:, None].expand(-1, self.h, -1, -1)], dim=-1)
        q = torch.cat([q_c, turned(q_r)], dim=-1)
        s = q @ k.transpose(-2, -1) / math.sqrt(self.d_h + self.d_r)
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(dim=-1)
        return self.o_proj((w @ v).transpose(1, 2).reshape(B, T, D)), w


class NoRopePart(PaperMLA):
    def scored(self, q_c, k_c, q_r, k_r):
        return q_c @ k_c.transpose(-2, -1) / math.sqrt(self.d_h)


class ScaledByDh(PaperMLA):
    def scored(self, q_c, k_c, q_r, k_r):
        return (q_c @ k_c.transpose(-2, -1) + q_r @ k_r.transpose(-2, -1)) / math.sqrt(self.d_h)


class NotNormed(PaperMLA):
    def latent(self, x):
        return self.W_DKV(x)


class NotTurned(PaperMLA):
    def forward(self, x, mask=None):
        B, T, D = x.shape
        q = self.W_Q(x).view(B, T, self.h, -1).transpose(1, 2)
        c = self.latent(x)
        k_c = self.W_UK(c).view(B, T, self.h, self.d_h).transpose(1, 2)
        v = self.W_UV(c).view(B, T, self.h, self.d_h).transpose(1, 2)
        s = self.scored(q[..., :self.d_h], k_c, q[..., self.d_h:], self.W_KR(x)[:, None])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(dim=-1)
        return self.W_O((w @ v).transpose(1, 2).reshape(B, T, D)), w


class NotNormedNorTurned(NotTurned):
    def latent(self, x):
        return self.W_DKV(x)


class RopePartFirst(PaperMLA):
    """Each head's query laid out [RoPE part; content part], the other way round from DeepSeek's."""

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q = self.W_Q(x).view(B, T, self.h, -1).transpose(1, 2)
        q_r, q_c = turned(q[..., :self.d_r]), q[..., self.d_r:]
        c = self.latent(x)
        k_c = self.W_UK(c).view(B, T, self.h, self.d_h).transpose(1, 2)
        v = self.W_UV(c).view(B, T, self.h, self.d_h).transpose(1, 2)
        s = self.scored(q_c, k_c, q_r, turned(self.W_KR(x))[:, None])
        if mask is not None:
            s = s.masked_fill(~mask, float("-inf"))
        w = s.softmax(dim=-1)
        return self.W_O((w @ v).transpose(1, 2).reshape(B, T, D)), w


class FusedNotNormed(FusedMLA):
    def __init__(self, d_model, num_heads, kv_rank, rope_dim):
        super().__init__(d_model, num_heads, kv_rank, rope_dim)
        self.kv_a_layernorm = nn.Identity()
