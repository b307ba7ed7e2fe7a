"""In the style of x-transformers' Attention (lucidrains/x-transformers,
x_transformers/x_transformers.py, MIT): to_q / to_k / to_v without bias, einops' rearrange, einsum
scores times scale, a boolean attn_mask filled with -finfo.max, to_out."""

import torch
import torch.nn as nn
from einops import rearrange
from torch import einsum


class Attention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64, dropout=0.1):
        super().__init__()
        self.scale = dim_head ** -0.5
        self.heads = heads
        inner = dim_head * heads
        self.to_q = nn.Linear(dim, inner, bias=False)
        self.to_k = nn.Linear(dim, inner, bias=False)
        self.to_v = nn.Linear(dim, inner, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x, context=None, attn_mask=None):
        kv_input = context if context is not None else x
        q, k, v = self.to_q(x), self.to_k(kv_input), self.to_v(kv_input)
        q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h n d", h=self.heads), (q, k, v))
        dots = einsum("b h i d, b h j d -> b h i j", q, k) * self.scale
        mask_value = -torch.finfo(dots.dtype).max
        if attn_mask is not None:
            dots = dots.masked_fill(~attn_mask, mask_value)
        attn = dots.softmax(dim=-1)
        attn = self.dropout(attn)
        out = einsum("b h i j, b h j d -> b h i d", attn, v)
        out = rearrange(out, "b h n d -> b n (h d)")
        return self.to_out(out)
