"""Multi-head attention, written out the way the lecture notes write it.

Nothing in this file knows about tracing or printing: the tracer watches it from outside.

>>> mha = MultiHeadAttention(d_model=512, heads=8)
>>> out, weights = mha(torch.randn(2, 10, 512))
>>> out.shape, weights.shape
(torch.Size([2, 10, 512]), torch.Size([2, 8, 10, 10]))
"""

import math

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    """Concat(head_1, ..., head_H) W_O, with head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i.

    kv_heads < heads shares each K/V head between heads // kv_heads query heads
    (grouped-query attention; kv_heads=1 is multi-query attention).
    """

    def __init__(self, d_model, heads, kv_heads=None, bias=True):
        super().__init__()
        kv_heads = kv_heads or heads
        self.d_model = d_model
        self.heads = heads
        self.kv_heads = kv_heads
        self.d_k = d_model // heads

        # four linear layers: Q, K, V projections (K and V smaller under GQA) and the output mix
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, kv_heads * self.d_k, bias=bias)
        self.W_v = nn.Linear(d_model, kv_heads * self.d_k, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, q, k=None, v=None, mask=None):
        """q, k, v: (B, T, d_model); k and v default to q. mask: bool, True where a query may look.

        Returns the output (B, T, d_model) and the per-head weights (B, H, T, T).
        """
        k = q if k is None else k
        v = q if v is None else v
        B = q.size(0)

        # project, then split d_model into heads and move heads next to batch
        Q = self.W_q(q).view(B, -1, self.heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)
        K = self.W_k(k).view(B, -1, self.kv_heads, self.d_k).transpose(1, 2)  # (B, Hkv, T, d_k)
        V = self.W_v(v).view(B, -1, self.kv_heads, self.d_k).transpose(1, 2)  # (B, Hkv, T, d_k)

        # grouped-query attention: each K/V head serves heads // kv_heads query heads
        if self.kv_heads != self.heads:
            K = K.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, T, d_k)
            V = V.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, T, d_k)

        # scaled dot-product attention, all heads at once
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, T, T)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)  # (B, H, T, T)
        if mask is not None:
            # a query row with every key masked has nothing to look at: weight 0, not NaN
            weights = weights.masked_fill(~mask, 0.0)
        context = torch.matmul(weights, V)  # (B, H, T, d_k)

        # concatenate heads: back to (B, T, H, d_k), copy to one block, merge H and d_k
        context = context.transpose(1, 2).contiguous().view(B, -1, self.d_model)  # (B, T, d_model)

        # output projection: mixes information across heads
        return self.W_o(context), weights
