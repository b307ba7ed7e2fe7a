"""A correct module written another way: other names, reshape/permute, einsum-free."""
import math
import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B, T, C = x.shape
        split = lambda t: t.reshape(B, T, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        att = q @ k.permute(0, 1, 3, 2) / math.sqrt(self.head_dim)
        if mask is not None:
            att = att.masked_fill(~mask, float("-inf"))
        att = att.softmax(-1)
        y = (att @ v).permute(0, 2, 1, 3).reshape(B, T, C)
        return self.out(y), att
