"""In the style of Hugging Face DistilBERT's MultiHeadSelfAttention (huggingface/transformers,
models/distilbert/modeling_distilbert.py, Apache-2.0): q_lin / k_lin / v_lin / out_lin, q
divided by √dim_per_head before the scores, shape / unshape helpers, dropout."""

import math

import torch
import torch.nn as nn


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim, n_heads, attention_dropout=0.1):
        super().__init__()
        self.n_heads, self.dim = n_heads, dim
        self.dropout = nn.Dropout(p=attention_dropout)
        self.q_lin = nn.Linear(dim, dim)
        self.k_lin = nn.Linear(dim, dim)
        self.v_lin = nn.Linear(dim, dim)
        self.out_lin = nn.Linear(dim, dim)

    def forward(self, query, key, value, output_attentions=False):
        bs, q_length, dim = query.size()
        dim_per_head = self.dim // self.n_heads

        def shape(x):
            return x.view(bs, -1, self.n_heads, dim_per_head).transpose(1, 2)

        def unshape(x):
            return x.transpose(1, 2).contiguous().view(bs, -1, self.n_heads * dim_per_head)

        q = shape(self.q_lin(query))
        k = shape(self.k_lin(key))
        v = shape(self.v_lin(value))
        q = q / math.sqrt(dim_per_head)
        scores = torch.matmul(q, k.transpose(2, 3))
        weights = nn.functional.softmax(scores, dim=-1)
        weights = self.dropout(weights)
        context = torch.matmul(weights, v)
        context = unshape(context)
        context = self.out_lin(context)
        return (context, weights) if output_attentions else (context,)
