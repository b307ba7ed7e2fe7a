"""Attention as 2026 teaches it, each a variant of the chapter's attention: soft-capping, QK-norm,
a position bias added to the scores, a sliding window, partial RoPE; the plain class is the lecture's."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Base(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def heads(self, x):
        B, T, _ = x.shape
        return [W(x).view(B, T, self.h, self.d_k).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v)]

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.heads(x)
        q, k = self.normed(q), self.normed(k)
        scores = self.capped(q @ k.transpose(-2, -1) / math.sqrt(self.d_k))
        w = scores.softmax(-1)
        return self.W_o((w @ v).transpose(1, 2).reshape(B, T, D)), w

    def normed(self, t):
        return t

    def capped(self, s):
        return s


class SoftCapped(Base):
    def capped(self, s):
        return 50.0 * torch.tanh(s / 50.0)


class QKNorm(Base):
    def normed(self, t):
        return F.rms_norm(t, (self.d_k,))


class PositionBias(Base):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.bias = nn.Parameter(torch.randn(num_heads, 64, 64) * 0.1)

    def capped(self, s):
        T = s.size(-1)
        return s + self.bias[:, :T, :T]


class SlidingWindow(Base):
    """Mistral's sliding window, made by the module: each query sees itself and the 3 keys before it."""

    def capped(self, s):
        T = s.size(-1)
        i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]
        return s.masked_fill(~((j <= i) & (j > i - 4)), float("-inf"))


class PartialRope(Base):
    """Phi's partial rotary: the first half of each head's dims turn with position, the rest pass."""

    def normed(self, t):
        T, r = t.size(-2), self.d_k // 2
        inv = 10000.0 ** (-torch.arange(0, r, 2, dtype=t.dtype) / r)
        angles = torch.cat([torch.arange(T, dtype=t.dtype)[:, None] * inv] * 2, dim=-1)
        turn, rest = t[..., :r], t[..., r:]
        half = torch.cat((-turn[..., r // 2:], turn[..., :r // 2]), dim=-1)
        return torch.cat((turn * angles.cos() + half * angles.sin(), rest), dim=-1)
