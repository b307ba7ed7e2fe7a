import math
import torch
import torch.nn as nn


def rotate(x, base=10000.0):
    T, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    ang = torch.cat([torch.arange(T, dtype=x.dtype)[:, None] * inv] * 2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * ang.cos() + torch.cat((-x2, x1), dim=-1) * ang.sin()


class Rotary(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def split(self, t, B, T):
        return t.view(B, T, self.h, self.d_k).transpose(1, 2)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q = rotate(self.split(self.W_q(x), B, T))
        k = rotate(self.split(self.W_k(x), B, T))
        v = rotate(self.split(self.W_v(x), B, T))  # <- the mistake
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        return self.W_o((w @ v).transpose(1, 2).reshape(B, T, D)), w
