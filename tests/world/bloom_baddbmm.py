"""The scores through torch.baddbmm with beta=0 and alpha=1/√d, as BLOOM's and GPT-NeoX's
attention compute them (Hugging Face's models/bloom/modeling_bloom.py, Apache-2.0; ALiBi left
out): query_key_value viewed head by head, heads folded into the batch, `dense` out."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class BloomAttention(nn.Module):
    def __init__(self, hidden_size, n_head):
        super().__init__()
        self.num_heads = n_head
        self.head_dim = hidden_size // n_head
        self.inv_norm_factor = 1.0 / math.sqrt(self.head_dim)
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        batch_size, q_length, _ = hidden_states.shape
        fused_qkv = self.query_key_value(hidden_states)
        fused_qkv = fused_qkv.view(batch_size, q_length, self.num_heads, 3, self.head_dim)
        query_layer, key_layer, value_layer = fused_qkv[..., 0, :], fused_qkv[..., 1, :], fused_qkv[..., 2, :]
        query_layer = query_layer.transpose(1, 2).reshape(batch_size * self.num_heads, q_length, self.head_dim)
        key_layer = key_layer.permute(0, 2, 3, 1).reshape(batch_size * self.num_heads, self.head_dim, q_length)
        value_layer = value_layer.transpose(1, 2).reshape(batch_size * self.num_heads, q_length, self.head_dim)
        empty = torch.zeros(batch_size * self.num_heads, q_length, q_length, dtype=query_layer.dtype)
        matmul_result = torch.baddbmm(empty, query_layer, key_layer, beta=0.0, alpha=self.inv_norm_factor)
        attention_probs = F.softmax(matmul_result, dim=-1)
        context_layer = torch.bmm(attention_probs, value_layer)
        context_layer = context_layer.view(batch_size, self.num_heads, q_length, self.head_dim)
        context_layer = context_layer.permute(0, 2, 1, 3).reshape(batch_size, q_length, -1)
        return self.dense(context_layer)
