"""Attention written keys first, as some course notes write it: forward(_K, _V, _Q) with the inputs'
names underscored, the scores laid out (B, H, T_keys, T_queries) and normalised over axis 2 (the
keys), the weights transposed before they meet V, and an additive mask named mask_attn."""

import math

import torch.nn as nn


class KeysFirstAttention(nn.Module):
    def __init__(self, d, num_heads):
        super().__init__()
        self.h, self.dk = num_heads, d // num_heads
        self.k_proj, self.v_proj = nn.Linear(d, d), nn.Linear(d, d)
        self.q_proj, self.out_proj = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, _K, _V, _Q, mask_attn=None):
        b, n_k, d = _K.shape
        n_q = _Q.shape[1]
        K = self.k_proj(_K).reshape(b, n_k, self.h, self.dk).transpose(1, 2)
        V = self.v_proj(_V).reshape(b, n_k, self.h, self.dk).transpose(1, 2)
        Q = self.q_proj(_Q).reshape(b, n_q, self.h, self.dk).transpose(1, 2)
        KQ = K @ Q.transpose(-2, -1) / math.sqrt(self.dk)
        if mask_attn is not None:
            KQ = KQ + mask_attn.transpose(-2, -1)
        weights = KQ.softmax(dim=2)
        out = (weights.transpose(-2, -1) @ V).transpose(1, 2).reshape(b, n_q, d)
        return self.out_proj(out)
