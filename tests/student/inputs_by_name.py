"""forward's inputs read by their names: OpenNMT's forward(key, value, query); and a forward that takes
rotary positions made outside the module (cos, sin), which verify refuses rather than feed."""

import math
import torch
import torch.nn as nn


class KeyValueQuery(nn.Module):
    """OpenNMT's order: forward(key, value, query)."""

    def __init__(self, d_model, heads):
        super().__init__()
        self.h, self.d = heads, d_model // heads
        self.linear_keys = nn.Linear(d_model, d_model)
        self.linear_values = nn.Linear(d_model, d_model)
        self.linear_query = nn.Linear(d_model, d_model)
        self.final_linear = nn.Linear(d_model, d_model)

    def forward(self, key, value, query, mask=None):
        B, T, D = query.shape
        k, v, q = (W(t).view(B, -1, self.h, self.d).transpose(1, 2) for W, t in
                   ((self.linear_keys, key), (self.linear_values, value), (self.linear_query, query)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        w = scores.softmax(-1)
        return self.final_linear((w @ v).transpose(1, 2).reshape(B, T, D)), w


class Rotary(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, cos, sin):
        return self.proj(x)
