"""BERT's self-attention: its attention_mask one row of the keys per sequence, (B, T), 1 where a
key is real, turned into an additive (B, 1, 1, T) mask inside forward."""

import math
import torch
import torch.nn as nn


class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.h, self.d = num_attention_heads, hidden_size // num_attention_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        B, T, D = hidden_states.shape
        q, k, v = (W(hidden_states).view(B, T, self.h, self.d).transpose(1, 2) for W in (self.query, self.key, self.value))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d)
        if attention_mask is not None:
            scores = scores + (1.0 - attention_mask[:, None, None, :].to(scores.dtype)) * -10000.0
        w = scores.softmax(-1)
        return self.dense((w @ v).transpose(1, 2).reshape(B, T, D)), w
