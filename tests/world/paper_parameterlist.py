"""The paper's own notation, "Attention Is All You Need" (Vaswani et al. 2017, section 3.2.2):
head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V), one d_model × d_k matrix per head in an
nn.ParameterList, MultiHead = Concat(head_1, ..., head_h) W^O."""

import math

import torch
import torch.nn as nn


class PaperMultiHead(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        d_k = d_model // h
        self.W_Q = nn.ParameterList([nn.Parameter(torch.randn(d_model, d_k) * 0.02) for _ in range(h)])
        self.W_K = nn.ParameterList([nn.Parameter(torch.randn(d_model, d_k) * 0.02) for _ in range(h)])
        self.W_V = nn.ParameterList([nn.Parameter(torch.randn(d_model, d_k) * 0.02) for _ in range(h)])
        self.W_O = nn.Parameter(torch.randn(h * d_k, d_model) * 0.02)

    def forward(self, Q, K, V):
        heads = []
        for W_q, W_k, W_v in zip(self.W_Q, self.W_K, self.W_V):
            q, k, v = Q @ W_q, K @ W_k, V @ W_v
            weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
            heads.append(weights @ v)
        return torch.cat(heads, dim=-1) @ self.W_O
