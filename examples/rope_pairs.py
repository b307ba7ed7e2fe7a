"""A student's attention with rotary positions (RoPE) that turns neighbouring pairs of dims, as GPT-J and RoFormer do: right under `verify --rope`, where the lecture's module turns halves."""
import torch
import torch.nn as nn


def rope_pairs(x, base=10000.0):
    T, d_k = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d_k, 2, dtype=x.dtype) / d_k)
    angles = torch.arange(T, dtype=x.dtype)[:, None] * inv  # (T, d_k / 2)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q = rope_pairs(self.W_q(x).view(B, T, self.h, self.d_k).transpose(1, 2))
        k = rope_pairs(self.W_k(x).view(B, T, self.h, self.d_k).transpose(1, 2))
        v = self.W_v(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / self.d_k ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        return self.W_o((weights @ v).transpose(1, 2).reshape(B, T, D)), weights
