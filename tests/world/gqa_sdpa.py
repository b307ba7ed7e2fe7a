"""Grouped-query attention as Mistral- and Qwen-style code writes it with PyTorch's fused kernel
(the repeat_kv of huggingface/transformers' models, Apache-2.0, then
F.scaled_dot_product_attention), positions left out: n_kv_heads K/V heads, each shared by
n_heads // n_kv_heads query heads, a boolean attn_mask, True where a query may look."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class GroupedQueryAttention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, mask=None):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim).transpose(1, 2)
        n_rep = self.n_heads // self.n_kv_heads
        xk = torch.repeat_interleave(xk, dim=1, repeats=n_rep)
        xv = torch.repeat_interleave(xv, dim=1, repeats=n_rep)
        out = F.scaled_dot_product_attention(xq, xk, xv, attn_mask=mask)
        out = out.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.wo(out)
