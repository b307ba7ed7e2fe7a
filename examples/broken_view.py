"""A student's attention with a classic bug: .view() after .transpose() without .contiguous()."""

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q = q.view(B, T, self.num_heads, self.d_k).transpose(1, 2)
        k = k.view(B, T, self.num_heads, self.d_k).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.d_k).transpose(1, 2)
        weights = torch.softmax(q @ k.transpose(-2, -1) / self.d_k ** 0.5, dim=-1)
        context = (weights @ v).transpose(1, 2).view(B, T, D)  # bug: needs .contiguous() first
        return self.out(context), weights
