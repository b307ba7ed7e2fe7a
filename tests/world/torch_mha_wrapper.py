"""A module that wraps PyTorch's own nn.MultiheadAttention (pytorch/pytorch, BSD-3-Clause), as
many tutorials do: batch_first, its boolean attn_mask True where a query may NOT look, the
per-head weights asked for."""

import torch.nn as nn


class SelfAttention(nn.Module):
    def __init__(self, d_model, num_heads, dropout=0.1):
        super().__init__()
        self.mha = nn.MultiheadAttention(d_model, num_heads, dropout=dropout, batch_first=True)

    def forward(self, x, attn_mask=None):
        out, weights = self.mha(x, x, x, attn_mask=attn_mask, need_weights=True,
                                average_attn_weights=False)
        return out, weights
