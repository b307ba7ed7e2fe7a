import math
import torch
import torch.nn as nn


class Abcd(nn.Module):
    """Four matrices with names that say nothing, defined in the order o, v, k, q."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.h, self.d_k = heads, d_model // heads
        self.a, self.b, self.c, self.d = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.h, self.d_k).transpose(1, 2)
        q, k, v = split(self.d(x)), split(self.c(x)), split(self.b(x))
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        return self.a((w @ v).transpose(1, 2).reshape(B, T, D)), w


class AbcdWrong(Abcd):
    def forward(self, x):
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.h, self.d_k).transpose(1, 2)
        q, k, v = split(self.d(x)), split(self.c(x)), split(self.b(x))
        w = torch.softmax(q @ k.transpose(-2, -1) / self.d_k, dim=-1)
        return self.a((w @ v).transpose(1, 2).reshape(B, T, D)), w
