import math
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class SeparateBiases(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.h, self.d_k = heads, d_model // heads
        for n in "qkvo":
            setattr(self, f"W_{n}", nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model)))
            setattr(self, f"b_{n}", nn.Parameter(torch.randn(d_model)))

    def forward(self, x):
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.h, self.d_k).transpose(1, 2)
        q, k, v = split(x @ self.W_q + self.b_q), split(x @ self.W_k + self.b_k), split(x @ self.W_v + self.b_v)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        out = (w @ v).transpose(1, 2).reshape(B, T, D)
        return out @ self.W_o + self.b_o, w


class FLinear(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.h, self.d_k = heads, d_model // heads
        for n in "qkvo":
            setattr(self, f"{n}_weight", nn.Parameter(torch.randn(d_model, d_model) / math.sqrt(d_model)))
            setattr(self, f"{n}_bias", nn.Parameter(torch.randn(d_model)))

    def forward(self, x):
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.h, self.d_k).transpose(1, 2)
        q = split(F.linear(x, self.q_weight, self.q_bias))
        k = split(F.linear(x, self.k_weight, self.k_bias))
        v = split(F.linear(x, self.v_weight, self.v_bias))
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        out = (w @ v).transpose(1, 2).reshape(B, T, D)
        return F.linear(out, self.o_weight, self.o_bias), w


class NumpyBiases:
    """The chapter's NumPy style with a bias beside each matrix."""

    def __init__(self, d_model, heads):
        rng = np.random.default_rng(0)
        self.h, self.d_k = heads, d_model // heads
        for n in "qkvo":
            setattr(self, f"W_{n}", rng.standard_normal((d_model, d_model)) / math.sqrt(d_model))
            setattr(self, f"b_{n}", rng.standard_normal(d_model))

    def forward(self, x):
        T, D = x.shape
        split = lambda t: t.reshape(T, self.h, self.d_k).transpose(1, 0, 2)
        q, k, v = split(x @ self.W_q + self.b_q), split(x @ self.W_k + self.b_k), split(x @ self.W_v + self.b_v)
        s = q @ k.transpose(0, 2, 1) / math.sqrt(self.d_k)
        w = np.exp(s - s.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        return (w @ v).transpose(1, 0, 2).reshape(T, D) @ self.W_o + self.b_o, w


class BiasForgotten(SeparateBiases):
    """b_q is defined and never added: a real mistake, still caught."""

    def forward(self, x):
        B, T, D = x.shape
        split = lambda t: t.view(B, T, self.h, self.d_k).transpose(1, 2)
        q, k, v = split(x @ self.W_q), split(x @ self.W_k + self.b_k), split(x @ self.W_v + self.b_v)
        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        out = (w @ v).transpose(1, 2).reshape(B, T, D)
        return out @ self.W_o + self.b_o, w
