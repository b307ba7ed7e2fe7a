"""A module over PyTorch's functional multi_head_attention_forward (pytorch/pytorch,
torch/nn/functional.py, BSD-3-Clause), as nn.MultiheadAttention itself calls it: in_proj_weight
and in_proj_bias as parameters, an out_proj layer, sequence-first (T, B, E) inputs, a boolean
attn_mask True where a query may NOT look, the weights averaged over heads."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class FunctionalMHA(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim))
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, query, key, value, attn_mask=None):
        return F.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight,
            self.in_proj_bias, None, None, False, 0.0, self.out_proj.weight, self.out_proj.bias,
            training=self.training, need_weights=True, attn_mask=attn_mask)
