"""The reference implementation printed in PyTorch's documentation of
F.scaled_dot_product_attention (pytorch/pytorch, BSD-3-Clause; "an efficient implementation
equivalent to the following"): attn_bias filled from a boolean attn_mask, scale_factor, +=, the
dropout call with train=True, used by a module with separate projections."""

import math

import torch
import torch.nn as nn


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                                 scale=None):
    L, S = query.size(-2), key.size(-2)
    scale_factor = 1 / math.sqrt(query.size(-1)) if scale is None else scale
    attn_bias = torch.zeros(L, S, dtype=query.dtype)
    if is_causal:
        temp_mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=0)
        attn_bias.masked_fill_(temp_mask.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_bias.masked_fill_(attn_mask.logical_not(), float("-inf"))
        else:
            attn_bias = attn_mask + attn_bias
    attn_weight = query @ key.transpose(-2, -1) * scale_factor
    attn_weight += attn_bias
    attn_weight = torch.softmax(attn_weight, dim=-1)
    attn_weight = torch.dropout(attn_weight, dropout_p, train=True)
    return attn_weight @ value


class DocsAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, attn_mask=None):
        B, T, E = x.shape
        heads = lambda t: t.view(B, T, self.num_heads, E // self.num_heads).transpose(1, 2)
        y = scaled_dot_product_attention(heads(self.q_proj(x)), heads(self.k_proj(x)),
                                         heads(self.v_proj(x)), attn_mask=attn_mask)
        return self.out_proj(y.transpose(1, 2).reshape(B, T, E))
