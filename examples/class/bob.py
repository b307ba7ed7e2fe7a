import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    """Bob writes it with einsum."""

    def __init__(self, embed_dim, num_heads, dropout=0.1):
        super().__init__()
        self.h = num_heads
        self.d = embed_dim // num_heads
        self.W_q = nn.Linear(embed_dim, embed_dim)
        self.W_k = nn.Linear(embed_dim, embed_dim)
        self.W_v = nn.Linear(embed_dim, embed_dim)
        self.W_o = nn.Linear(embed_dim, embed_dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, attn_mask=None):
        B, S, _ = query.shape
        T = key.shape[1]
        q = self.W_q(query).reshape(B, S, self.h, self.d)
        k = self.W_k(key).reshape(B, T, self.h, self.d)
        v = self.W_v(value).reshape(B, T, self.h, self.d)
        logits = torch.einsum("bshd,bthd->bhst", q, k) / self.d
        if attn_mask is not None:
            logits = logits.masked_fill(~attn_mask.bool(), float("-inf"))
        weights = self.dropout(logits.softmax(dim=-1))
        out = torch.einsum("bhst,bthd->bshd", weights, v).reshape(B, S, -1)
        return self.W_o(out)
