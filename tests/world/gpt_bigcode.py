"""Hugging Face's GPTBigCodeAttention (StarCoder) in its multi-query form: one fused c_attn gives
the queries and a single key and value head; the queries' heads are folded into the rows so one
baddbmm scores them all against the shared key; the causal mask is its own."""

import math

import torch
import torch.nn as nn


class GPTBigCodeAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.embed_dim = hidden_size
        self.num_heads = num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.kv_dim = self.head_dim  # multi-query: one key and value head
        self.c_attn = nn.Linear(self.embed_dim, self.embed_dim + 2 * self.kv_dim)
        self.c_proj = nn.Linear(self.embed_dim, self.embed_dim)

    def forward(self, hidden_states):
        batch, seq, _ = hidden_states.shape
        query, key_value = self.c_attn(hidden_states).split((self.embed_dim, 2 * self.kv_dim), dim=2)
        key, value = key_value.split((self.head_dim, self.head_dim), dim=-1)
        query = query.reshape(batch, seq * self.num_heads, self.head_dim)
        scale = 1 / math.sqrt(self.head_dim)
        empty = torch.empty(batch, seq * self.num_heads, seq, dtype=query.dtype, device=query.device)
        attn_weights = torch.baddbmm(empty, query, key.transpose(-1, -2), beta=0, alpha=scale)
        attn_weights = attn_weights.view(batch, seq, self.num_heads, seq)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=hidden_states.device).tril()
        attn_weights = attn_weights.masked_fill(~causal[:, None, :], torch.finfo(attn_weights.dtype).min)
        attn_weights = attn_weights.softmax(dim=-1)
        attn_output = torch.bmm(attn_weights.view(batch, seq * self.num_heads, seq), value)
        attn_output = attn_output.view(batch, seq, self.embed_dim)
        return self.c_proj(attn_output)
