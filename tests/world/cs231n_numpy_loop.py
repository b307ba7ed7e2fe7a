"""Multi-head attention as NumPy coursework writes it (the loop-over-heads style of Stanford
CS231n's and d2l's NumPy exercises): full d_model × d_model matrices W_q ... W_o used as x @ W,
each head a slice of columns, a Python loop, np.concatenate; forward(x, mask) with a boolean
mask, True where a query may look."""

import numpy as np


class LoopMultiHeadAttention:
    def __init__(self, d_model, num_heads):
        rng = np.random.default_rng(1)
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q = rng.normal(0, 0.1, (d_model, d_model))
        self.W_k = rng.normal(0, 0.1, (d_model, d_model))
        self.W_v = rng.normal(0, 0.1, (d_model, d_model))
        self.W_o = rng.normal(0, 0.1, (d_model, d_model))

    def forward(self, x, mask=None):
        Q, K, V = x @ self.W_q, x @ self.W_k, x @ self.W_v
        heads = []
        for i in range(self.h):
            cols = slice(i * self.d_k, (i + 1) * self.d_k)
            scores = Q[:, cols] @ K[:, cols].T / np.sqrt(self.d_k)
            if mask is not None:
                scores = np.where(mask, scores, -np.inf)
            w = np.exp(scores - scores.max(axis=-1, keepdims=True))
            w = w / w.sum(axis=-1, keepdims=True)
            heads.append(w @ V[:, cols])
        return np.concatenate(heads, axis=-1) @ self.W_o
