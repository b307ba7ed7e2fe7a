"""Attention over blocks of keys with a running maximum and sum, as the memory-efficient and
FlashAttention papers describe it (Rabe & Staats 2021, "Self-attention Does Not Need O(n²)
Memory"; Dao et al. 2022), in plain PyTorch: never the whole T × T weights, the same output."""

import math

import torch
import torch.nn as nn


class ChunkedAttention(nn.Module):
    def __init__(self, d_model, heads, block=4):
        super().__init__()
        self.h, self.block = heads, block
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.h, D // self.h).transpose(1, 2)
        q, k, v = split(self.q(x)) / math.sqrt(D // self.h), split(self.k(x)), split(self.v(x))
        m = torch.full((B, self.h, T, 1), float("-inf"), dtype=x.dtype)
        l = torch.zeros(B, self.h, T, 1, dtype=x.dtype)
        acc = torch.zeros_like(q)
        for start in range(0, T, self.block):
            s = q @ k[:, :, start:start + self.block].transpose(-2, -1)
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            p = torch.exp(s - m_new)
            rescale = torch.exp(m - m_new)
            l = l * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + p @ v[:, :, start:start + self.block]
            m = m_new
        out = (acc / l).transpose(1, 2).reshape(B, T, D)
        return self.o(out)
