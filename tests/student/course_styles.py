import math

import torch
import torch.nn as nn
from torch.nn import functional as F


class MultiHeadAttention(nn.Module):
    """CS231n's layout: key, query, value and proj; forward(query, key, value, attn_mask)."""

    def __init__(self, embed_dim, num_heads, dropout=0.1):
        super().__init__()
        assert embed_dim % num_heads == 0
        self.key = nn.Linear(embed_dim, embed_dim)
        self.query = nn.Linear(embed_dim, embed_dim)
        self.value = nn.Linear(embed_dim, embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.attn_drop = nn.Dropout(dropout)
        self.n_head = num_heads
        self.emd_dim = embed_dim
        self.head_dim = self.emd_dim // self.n_head

    def forward(self, query, key, value, attn_mask=None):
        N, S, E = query.shape
        N, T, E = value.shape
        H = self.n_head
        q = self.query(query).view(N, S, H, E // H).transpose(1, 2)
        k = self.key(key).view(N, T, H, E // H).transpose(1, 2)
        v = self.value(value).view(N, T, H, E // H).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(E // H)
        if attn_mask is not None:
            scores = self.masked(scores, attn_mask)
        attn = self.attn_drop(F.softmax(scores, dim=-1))
        Y = (attn @ v).transpose(1, 2).reshape(N, S, E)
        return self.proj(Y)

    def masked(self, scores, attn_mask):
        return scores.masked_fill(attn_mask == 0, float("-inf"))


class InvertedMask(MultiHeadAttention):
    """The same with its mask read the other way round: True where a query may NOT attend."""

    def masked(self, scores, attn_mask):
        return scores.masked_fill(attn_mask, float("-inf"))


class Eecs498Style(nn.Module):
    """EECS 498's layout: one (N, K, K) boolean mask, True where a query may NOT attend, filled
    with -1e9."""

    def __init__(self, num_heads, dim_in, dim_out=None):
        super().__init__()
        dim_out = dim_out or dim_in
        self.heads = num_heads
        self.q = nn.Linear(dim_in, dim_out)
        self.k = nn.Linear(dim_in, dim_out)
        self.v = nn.Linear(dim_in, dim_out)
        self.out = nn.Linear(dim_out, dim_in)

    def forward(self, query, key, value, mask=None):
        N, K, D = query.shape
        H, d = self.heads, D // self.heads
        q = self.q(query).view(N, K, H, d).transpose(1, 2)
        k = self.k(key).view(N, K, H, d).transpose(1, 2)
        v = self.v(value).view(N, K, H, d).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1) if mask.dim() == 3 else mask, -1e9)
        weights = scores.softmax(-1)
        return self.out((weights @ v).transpose(1, 2).reshape(N, K, D))
