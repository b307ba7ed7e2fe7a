"""In the style of GPT-NeoX's attention (EleutherAI/gpt-neox and Hugging Face's
models/gpt_neox/modeling_gpt_neox.py, Apache-2.0): one query_key_value layer whose output is
viewed as (B, T, H, 3·d) (each head's q, k and v side by side), `dense` out, the norm factor
√d, positions left out."""

import math

import torch
import torch.nn as nn


class GPTNeoXAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.head_size = hidden_size // num_attention_heads
        self.norm_factor = math.sqrt(self.head_size)
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states, attention_mask=None):
        qkv = self.query_key_value(hidden_states)
        new_qkv_shape = qkv.size()[:-1] + (self.num_attention_heads, 3 * self.head_size)
        qkv = qkv.view(*new_qkv_shape)
        query = qkv[..., : self.head_size].permute(0, 2, 1, 3)
        key = qkv[..., self.head_size: 2 * self.head_size].permute(0, 2, 1, 3)
        value = qkv[..., 2 * self.head_size:].permute(0, 2, 1, 3)
        attn_scores = torch.matmul(query, key.transpose(-1, -2)) / self.norm_factor
        if attention_mask is not None:
            attn_scores = attn_scores + attention_mask
        attn_weights = nn.functional.softmax(attn_scores, dim=-1)
        attn_output = torch.matmul(attn_weights, value)
        attn_output = attn_output.permute(0, 2, 1, 3).contiguous()
        attn_output = attn_output.view(attn_output.size(0), attn_output.size(1), -1)
        return self.dense(attn_output), attn_weights
