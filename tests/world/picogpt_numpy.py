"""In the style of picoGPT's mha (jaymody/picoGPT, gpt2.py, MIT), in NumPy: c_attn and c_proj
weights stored [in, out] with their biases, np.split into q, k, v and into heads, a causal mask
of -1e10 added, a list comprehension over heads, np.hstack."""

import numpy as np


def softmax(x):
    exp_x = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return exp_x / np.sum(exp_x, axis=-1, keepdims=True)


def linear(x, w, b):
    return x @ w + b


def attention(q, k, v, mask):
    return softmax(q @ k.T / np.sqrt(q.shape[-1]) + mask) @ v


class PicoMHA:
    def __init__(self, n_embd, n_head):
        rng = np.random.default_rng(0)
        self.n_head = n_head
        self.c_attn_w = rng.normal(0, 0.02, (n_embd, 3 * n_embd))
        self.c_attn_b = np.zeros(3 * n_embd)
        self.c_proj_w = rng.normal(0, 0.02, (n_embd, n_embd))
        self.c_proj_b = np.zeros(n_embd)

    def forward(self, x):
        x = linear(x, self.c_attn_w, self.c_attn_b)
        qkv = np.split(x, 3, axis=-1)
        qkv_heads = list(map(lambda x: np.split(x, self.n_head, axis=-1), qkv))
        causal_mask = (1 - np.tri(x.shape[0], dtype=x.dtype)) * -1e10
        out_heads = [attention(q, k, v, causal_mask) for q, k, v in zip(*qkv_heads)]
        x = np.hstack(out_heads)
        return linear(x, self.c_proj_w, self.c_proj_b)
