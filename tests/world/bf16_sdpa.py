"""Mixed precision as training code writes it: the fused kernel run in bfloat16
(F.scaled_dot_product_attention on bfloat16 tensors, the result cast back), the projections in
the module's own precision. Right, within bfloat16's precision."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class BF16Attention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q.to(torch.bfloat16), k.to(torch.bfloat16),
                                           v.to(torch.bfloat16)).to(x.dtype)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))
