import math

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    """Carol keeps one weight per projection and loops over the heads."""

    def __init__(self, embed_dim, num_heads, dropout=0.1):
        super().__init__()
        self.num_heads = num_heads
        self.Wq = nn.Parameter(torch.randn(embed_dim, embed_dim) / math.sqrt(embed_dim))
        self.Wk = nn.Parameter(torch.randn(embed_dim, embed_dim) / math.sqrt(embed_dim))
        self.Wv = nn.Parameter(torch.randn(embed_dim, embed_dim) / math.sqrt(embed_dim))
        self.out = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, attn_mask=None):
        d = query.shape[-1] // self.num_heads
        q, k, v = query @ self.Wq, key @ self.Wk, value @ self.Wv
        heads = []
        for h in range(self.num_heads):
            part = slice(h * d, (h + 1) * d)
            scores = q[..., part] @ k[..., part].transpose(-2, -1) / math.sqrt(d)
            if attn_mask is not None:
                scores = scores.masked_fill(attn_mask == 1, float("-inf"))
            heads.append(torch.softmax(scores, dim=-1) @ v[..., part])
        return self.out(torch.cat(heads, dim=-1))
