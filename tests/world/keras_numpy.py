"""Keras-style multi-head attention written in NumPy (the layer-as-callable style of
keras.layers.MultiHeadAttention's docs and of NumPy tutorials): weights in a dict, the layer
called with __call__(query, value, key=None), no forward method."""

import numpy as np


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


class MultiHeadAttentionLayer:
    def __init__(self, num_heads, key_dim):
        self.num_heads, self.key_dim = num_heads, key_dim
        d = num_heads * key_dim
        rng = np.random.default_rng(0)
        self.query_kernel = rng.normal(0, 0.02, (d, d))
        self.key_kernel = rng.normal(0, 0.02, (d, d))
        self.value_kernel = rng.normal(0, 0.02, (d, d))
        self.output_kernel = rng.normal(0, 0.02, (d, d))

    def __call__(self, x):
        T, d = x.shape
        q = (x @ self.query_kernel).reshape(T, self.num_heads, self.key_dim).transpose(1, 0, 2)
        k = (x @ self.key_kernel).reshape(T, self.num_heads, self.key_dim).transpose(1, 0, 2)
        v = (x @ self.value_kernel).reshape(T, self.num_heads, self.key_dim).transpose(1, 0, 2)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(self.key_dim)
        weights = softmax(scores, axis=-1)
        context = (weights @ v).transpose(1, 0, 2).reshape(T, d)
        return context @ self.output_kernel, weights
