"""Haiku's MultiHeadAttention (haiku/_src/attention.py) ported to PyTorch as JAX users write it:
each projection a kernel of shape (model_size, num_heads, key_size) applied with einsum, the output
a (num_heads, key_size, model_size) kernel, a boolean mask applied with where."""

import math

import torch
import torch.nn as nn


def _kernel(*shape):
    return nn.Parameter(torch.randn(*shape) / math.sqrt(shape[0]))


class MultiHeadAttention(nn.Module):
    def __init__(self, num_heads, key_size, model_size=None):
        super().__init__()
        self.num_heads, self.key_size = num_heads, key_size
        self.model_size = model_size or key_size * num_heads
        D = self.model_size
        self.query_w, self.query_b = _kernel(D, num_heads, key_size), nn.Parameter(torch.zeros(num_heads, key_size))
        self.key_w, self.key_b = _kernel(D, num_heads, key_size), nn.Parameter(torch.zeros(num_heads, key_size))
        self.value_w, self.value_b = _kernel(D, num_heads, key_size), nn.Parameter(torch.zeros(num_heads, key_size))
        self.linear_w, self.linear_b = _kernel(num_heads, key_size, D), nn.Parameter(torch.zeros(D))

    def forward(self, query, key, value, mask=None):
        q = torch.einsum("...td,dhk->...thk", query, self.query_w) + self.query_b
        k = torch.einsum("...td,dhk->...thk", key, self.key_w) + self.key_b
        v = torch.einsum("...td,dhk->...thk", value, self.value_w) + self.value_b
        attn_logits = torch.einsum("...thd,...Thd->...htT", q, k)
        attn_logits = attn_logits / math.sqrt(self.key_size)
        if mask is not None:
            attn_logits = torch.where(mask, attn_logits, -1e30)
        attn_weights = torch.softmax(attn_logits, dim=-1)
        attn = torch.einsum("...htT,...Thd->...thd", attn_weights, v)
        return torch.einsum("...thd,hdD->...tD", attn, self.linear_w) + self.linear_b
