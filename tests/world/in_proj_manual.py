"""nn.MultiheadAttention's parameters used by hand, batch first, as OpenCLIP's and many
vision codebases' custom Attention do (mlfoundations/open_clip, src/open_clip/transformer.py, MIT):
in_proj_weight (3·d, d) and in_proj_bias as parameters, F.linear then chunk, out_proj."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class InProjAttention(nn.Module):
    def __init__(self, dim, num_heads=8):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.in_proj_weight = nn.Parameter(torch.randn((dim * 3, dim)) * self.scale)
        self.in_proj_bias = nn.Parameter(torch.zeros(dim * 3))
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x, attn_mask=None):
        B, L, C = x.shape
        q, k, v = F.linear(x, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q = q.reshape(B, L, self.num_heads, -1).transpose(1, 2)
        k = k.reshape(B, L, self.num_heads, -1).transpose(1, 2)
        v = v.reshape(B, L, self.num_heads, -1).transpose(1, 2)
        attn = (q * self.scale) @ k.transpose(-1, -2)
        if attn_mask is not None:
            attn = attn.masked_fill(~attn_mask, float("-inf"))
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, L, C)
        return self.out_proj(x)
