"""In the style of TransformerLens' Attention (TransformerLensOrg/TransformerLens,
components/abstract_attention.py, MIT): per-head 3-D weights W_Q, W_K, W_V [n_heads, d_model,
d_head] and W_O [n_heads, d_head, d_model], biases b_Q... [n_heads, d_head], einsum throughout,
the output summed over heads."""

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        d_head = d_model // n_heads
        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_K = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_V = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_O = nn.Parameter(torch.zeros(d_model))
        for w in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(w, std=0.02)
        self.attn_scale = d_head ** 0.5

    def forward(self, resid):
        q = torch.einsum("bpm,hmd->bphd", resid, self.W_Q) + self.b_Q
        k = torch.einsum("bpm,hmd->bphd", resid, self.W_K) + self.b_K
        v = torch.einsum("bpm,hmd->bphd", resid, self.W_V) + self.b_V
        attn_scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / self.attn_scale
        pattern = torch.softmax(attn_scores, dim=-1)
        z = torch.einsum("bkhd,bhqk->bqhd", v, pattern)
        out = torch.einsum("bqhd,hdm->bqm", z, self.W_O) + self.b_O
        return out, pattern
