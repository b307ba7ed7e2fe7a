"""Attention written in einsum alone, as einsum tutorials write it ("Einsum is All you Need",
Tim Rocktäschel's blog, and the einops docs): the heads a named axis, no transpose anywhere."""

import torch
import torch.nn as nn


class EinsumAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h = n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q = self.w_q(x).reshape(b, t, self.h, d // self.h)
        k = self.w_k(x).reshape(b, t, self.h, d // self.h)
        v = self.w_v(x).reshape(b, t, self.h, d // self.h)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / (d // self.h) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = scores.softmax(dim=-1)
        out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(b, t, d)
        return self.w_o(out), weights
