""""Multi-Head Attention Dimensional Splitting" reference sheet, as written: forward(x)."""

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0
        self.d_model = d_model
        self.h = num_heads
        self.d_k = d_model // num_heads

        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.size() # Batch, SeqLength, d_model

        # Project and reshape to [B, h, T, d_k]
        q = self.w_q(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        k = self.w_k(x).view(B, T, self.h, self.d_k).transpose(1, 2)
        v = self.w_v(x).view(B, T, self.h, self.d_k).transpose(1, 2)

        # Scale dot-product attention
        scores = (q @ k.transpose(-2, -1)) / (self.d_k ** 0.5)
        # Apply causal mask here if needed...
        weights = torch.softmax(scores, dim=-1)
        context = weights @ v # Shape: [B, h, T, d_k]

        # Concatenate and project output
        context = context.transpose(1, 2).contiguous().view(B, T, C)
        return self.w_o(context)
