"""Student modules with rotary positions (RoPE) on Q and K, for `verify --module ... --rope`:
the two conventions (turning the two halves, as GPT-NeoX and LLaMA do; turning neighbouring
pairs, as GPT-J and RoFormer do), both right, and the mistake of turning V too."""
import torch
import torch.nn as nn


def angles(T, d_k, base=10000.0):
    inv = base ** (-torch.arange(0, d_k, 2, dtype=torch.float64) / d_k)
    return torch.arange(T, dtype=torch.float64)[:, None] * inv  # (T, d_k / 2)


def rope_halves(x):
    a = angles(x.shape[-2], x.shape[-1])
    cos, sin = a.cos().repeat(1, 2), a.sin().repeat(1, 2)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rope_pairs(x):
    a = angles(x.shape[-2], x.shape[-1])
    cos, sin = a.cos(), a.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class RotaryAttention(nn.Module):
    turn = staticmethod(rope_halves)
    on_v = False

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q = self.W_q(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        k = self.W_k(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        v = self.W_v(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        q, k = self.turn(q), self.turn(k)
        v = self.turn(v) if self.on_v else v
        scores = q @ k.transpose(-2, -1) / self.d_k ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(B, T, D)
        return self.W_o(out), weights


class RotaryPairs(RotaryAttention):
    turn = staticmethod(rope_pairs)


class RotaryOnV(RotaryAttention):
    on_v = True
