"""Megatron-LM's ParallelAttention (megatron/model/transformer.py) on one GPU: sequence first
[s, b, h]; one query_key_value Linear whose output goes head by head, each head's q, k and v side
by side, split with torch.split; baddbmm with alpha = 1/√d_k; a boolean mask True where a query
may NOT attend, filled with -10000; a dense output projection."""

import math

import torch
import torch.nn as nn


class ParallelAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, attention_dropout=0.0):
        super().__init__()
        self.hidden_size = hidden_size
        self.np = num_attention_heads
        self.hn = hidden_size // num_attention_heads
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.norm_factor = math.sqrt(self.hn)
        self.attention_dropout = nn.Dropout(attention_dropout)

    def forward(self, hidden_states, attention_mask=None):
        mixed_x_layer = self.query_key_value(hidden_states)
        mixed_x_layer = mixed_x_layer.view(*mixed_x_layer.size()[:-1], self.np, 3 * self.hn)
        query_layer, key_layer, value_layer = torch.split(mixed_x_layer, self.hn, dim=3)
        sq, b, sk = query_layer.size(0), query_layer.size(1), key_layer.size(0)
        query_layer = query_layer.reshape(sq, b * self.np, -1)
        key_layer = key_layer.reshape(sk, b * self.np, -1)
        empty = torch.empty(b * self.np, sq, sk, dtype=query_layer.dtype, device=query_layer.device)
        matmul_result = torch.baddbmm(empty, query_layer.transpose(0, 1), key_layer.transpose(0, 1).transpose(1, 2),
                                      beta=0.0, alpha=(1.0 / self.norm_factor))
        attention_scores = matmul_result.view(b, self.np, sq, sk)
        if attention_mask is not None:
            attention_scores = attention_scores.masked_fill(attention_mask, -10000.0)
        attention_probs = torch.softmax(attention_scores, dim=-1)
        attention_probs = self.attention_dropout(attention_probs)
        value_layer = value_layer.reshape(sk, b * self.np, -1)
        attention_probs = attention_probs.view(b * self.np, sq, sk)
        context_layer = torch.bmm(attention_probs, value_layer.transpose(0, 1))
        context_layer = context_layer.view(b, self.np, sq, self.hn).permute(2, 0, 1, 3).contiguous()
        context_layer = context_layer.view(sq, b, self.hidden_size)
        return self.dense(context_layer)
