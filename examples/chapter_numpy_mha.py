"""Chapter 2 "Multi-Head Attention", NumPy implementation, as written.

The class and the shared example are the chapter's; its demo run is kept under __main__ so
that importing the file (as --module does) prints nothing. Inputs are unbatched (N, d_model).
"""

import numpy as np
import math

class MultiHeadAttention:
    """
    Multi-Head Attention (Vaswani et al., 2017)

    Splits Q, K, V into H heads, runs scaled dot-product attention
    on each head independently, then concatenates the results.

    MultiHead(Q, K, V) = Concat(head_1, ..., head_H) @ W_O
    head_i = Attention(Q @ W_i^Q, K @ W_i^K, V @ W_i^V)
    """

    def __init__(self, d_model: int, num_heads: int):
        """
        Args:
            d_model:   Total model dimension (4 in our example)
            num_heads: Number of attention heads H (2 in our example)
        """
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.scale = math.sqrt(self.d_k)

    def _softmax(self, x: np.ndarray) -> np.ndarray:
        """Numerically stable softmax along last axis."""
        x_shifted = x - np.max(x, axis=-1, keepdims=True)
        exp_x = np.exp(x_shifted)
        return exp_x / np.sum(exp_x, axis=-1, keepdims=True)

    def split_heads(self, M: np.ndarray) -> list:
        """Split matrix M (N, d_model) into H matrices of (N, d_k)."""
        heads = []
        for h in range(self.num_heads):
            start = h * self.d_k
            end = start + self.d_k
            heads.append(M[:, start:end])
        return heads

    def attention(self, Qh: np.ndarray, Kh: np.ndarray, Vh: np.ndarray):
        """Single-head scaled dot-product attention."""
        scores = Qh @ Kh.T
        scaled = scores / self.scale
        weights = self._softmax(scaled)
        output = weights @ Vh
        return weights, output

    def forward(self, Q: np.ndarray, K: np.ndarray, V: np.ndarray):
        """
        Full multi-head forward pass.

        Args:
            Q: Query matrix  (N, d_model)
            K: Key matrix    (N, d_model)
            V: Value matrix  (N, d_model)

        Returns:
            all_weights: List of H attention matrices, each (N, N)
            output:      Concatenated output (N, d_model)
        """
        Q_heads = self.split_heads(Q)
        K_heads = self.split_heads(K)
        V_heads = self.split_heads(V)

        all_weights = []
        all_outputs = []

        for h in range(self.num_heads):
            w, o = self.attention(Q_heads[h], K_heads[h], V_heads[h])
            all_weights.append(w)
            all_outputs.append(o)

        output = np.hstack(all_outputs)
        return all_weights, output

    def explain(self, Q: np.ndarray, K: np.ndarray, V: np.ndarray,
                tokens: list, query_idx: int = 0):
        """Print a detailed trace for a specific query token."""
        all_weights, output = self.forward(Q, K, V)
        Q_heads = self.split_heads(Q)
        K_heads = self.split_heads(K)

        token = tokens[query_idx]
        print(f"\n=== Multi-Head trace for '{token}' (row {query_idx}) ===")

        for h in range(self.num_heads):
            start = h * self.d_k
            end = start + self.d_k
            print(f"\n--- Head {h+1} (dims {start}:{end}, d_k={self.d_k}) ---")
            print(f"  Q_h{h+1}[{token}] = {Q_heads[h][query_idx]}")
            for j, t in enumerate(tokens):
                dot = Q_heads[h][query_idx] @ K_heads[h][j]
                print(f"  Q[{token}] . K[{t}] = {dot:.4f} -> /{self.scale:.2f} = {dot/self.scale:.4f}")
            print(f"  weights = {np.round(all_weights[h][query_idx], 4)}")

        print(f"\nConcatenated output[{token}] = {np.round(output[query_idx], 4)}")


# ── Shared Example (used in every chapter) ──
tokens = ["The", "cat", "sat", "on", "mat"]

Q = np.array([
    [1.0, 0.0, 1.0, 0.0],   # The
    [0.0, 2.0, 0.0, 1.0],   # cat
    [1.0, 1.0, 1.0, 0.0],   # sat
    [0.0, 0.0, 1.0, 1.0],   # on
    [1.0, 0.0, 0.0, 1.0],   # mat
])

K = np.array([
    [0.0, 1.0, 0.0, 1.0],   # The
    [1.0, 0.0, 1.0, 0.0],   # cat
    [1.0, 1.0, 0.0, 0.0],   # sat
    [0.0, 0.0, 1.0, 1.0],   # on
    [1.0, 0.0, 0.5, 0.5],   # mat
])

V = np.array([
    [1.0, 0.0, 0.0, 0.0],   # The
    [0.0, 1.0, 0.0, 0.0],   # cat
    [0.0, 0.0, 1.0, 0.0],   # sat
    [0.0, 0.0, 0.0, 1.0],   # on
    [0.5, 0.5, 0.5, 0.5],   # mat
])

# ── Run ──
if __name__ == "__main__":
    mha = MultiHeadAttention(d_model=4, num_heads=2)
    all_weights, output = mha.forward(Q, K, V)

    print("Head 1 Attention Weights (5x5):")
    print(np.round(all_weights[0], 4))

    print("\nHead 2 Attention Weights (5x5):")
    print(np.round(all_weights[1], 4))

    print("\nConcatenated Output (5x4):")
    print(np.round(output, 4))

    # Detailed trace for "The" (token 0)
    mha.explain(Q, K, V, tokens, query_idx=0)
