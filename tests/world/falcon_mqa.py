"""Multi-query attention in the style of Falcon-7B's attention (Hugging Face's
models/falcon/modeling_falcon.py, Apache-2.0): query_key_value of d_model + 2·head_dim rows,
split into all the query heads and one key and one value head, `dense` out, positions left out."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class FalconAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        self.query_key_value = nn.Linear(hidden_size, hidden_size + 2 * self.head_dim, bias=False)
        self.dense = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        batch_size, seq_length, _ = hidden_states.shape
        fused_qkv = self.query_key_value(hidden_states)
        fused_qkv = fused_qkv.view(batch_size, seq_length, self.num_heads + 2, self.head_dim)
        query, key, value = fused_qkv[..., :-2, :], fused_qkv[..., [-2], :], fused_qkv[..., [-1], :]
        query, key, value = (t.transpose(1, 2) for t in (query, key, value))
        scores = query @ key.transpose(-1, -2) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            scores = scores.masked_fill(~attention_mask, float("-inf"))
        attn = F.softmax(scores, dim=-1)
        out = (attn @ value).transpose(1, 2).reshape(batch_size, seq_length, -1)
        return self.dense(out)
