"""Multi-query attention in the style of MosaicML MPT's MultiQueryAttention (mosaicml/llm-foundry,
llmfoundry/models/layers/attention.py, Apache-2.0): one Wqkv of d_model + 2·head_dim rows (all the
query heads, then one key head and one value head), the key and value shared by every query
head, out_proj."""

import math

import torch
import torch.nn as nn


class MultiQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        self.head_dim = d_model // n_heads
        self.Wqkv = nn.Linear(d_model, d_model + 2 * self.head_dim)
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x, attn_mask=None):
        b, s, _ = x.shape
        qkv = self.Wqkv(x)
        query, key, value = qkv.split([self.d_model, self.head_dim, self.head_dim], dim=2)
        q = query.view(b, s, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
        k = key.view(b, s, 1, self.head_dim).permute(0, 2, 3, 1)  # (b, 1, d, s): pre-transposed
        v = value.view(b, s, 1, self.head_dim).transpose(1, 2)
        attn_weight = q.matmul(k) * (1 / math.sqrt(self.head_dim))
        if attn_mask is not None:
            attn_weight = attn_weight.masked_fill(~attn_mask, torch.finfo(q.dtype).min)
        attn_weight = torch.softmax(attn_weight, dim=-1)
        out = attn_weight.matmul(v)
        out = out.permute(0, 2, 1, 3).reshape(b, s, self.d_model)
        return self.out_proj(out), attn_weight
