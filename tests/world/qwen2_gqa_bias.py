"""In the style of Hugging Face Qwen2's attention (models/qwen2/modeling_qwen2.py, Apache-2.0):
q_proj, k_proj and v_proj with biases and o_proj without, grouped-query K and V, rotary
positions on the two halves, F.scaled_dot_product_attention with enable_gqa."""

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Qwen2Attention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads, rope_theta=10000.0):
        super().__init__()
        self.num_heads, self.num_kv = num_attention_heads, num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        self.rope_theta = rope_theta
        self.q_proj = nn.Linear(hidden_size, self.num_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(hidden_size, self.num_kv * self.head_dim, bias=True)
        self.v_proj = nn.Linear(hidden_size, self.num_kv * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, hidden_size, bias=False)

    def forward(self, x, attention_mask=None):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=x.dtype) / self.head_dim))
        freqs = torch.outer(torch.arange(t, dtype=x.dtype), inv_freq)
        cos, sin = torch.cat((freqs, freqs), dim=-1).cos(), torch.cat((freqs, freqs), dim=-1).sin()
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
