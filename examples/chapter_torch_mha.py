"""Chapter 2 "Multi-Head Attention", PyTorch implementation, as written.

Note its order: it returns (weights, output), and its mask is True where attention is *blocked*.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
import math

class MultiHeadAttention(nn.Module):
    """
    Multi-Head Attention (Vaswani et al., 2017) — PyTorch

    Splits Q, K, V into H heads, runs scaled dot-product attention
    on each, then concatenates and projects with W_O.

    Supports GPU, automatic differentiation, and batched inputs.
    """

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.scale = math.sqrt(self.d_k)

        # Learned projection matrices (not used in this example,
        # but included for production completeness)
        self.W_Q = nn.Linear(d_model, d_model, bias=False)
        self.W_K = nn.Linear(d_model, d_model, bias=False)
        self.W_V = nn.Linear(d_model, d_model, bias=False)
        self.W_O = nn.Linear(d_model, d_model, bias=False)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """Reshape (B, N, d_model) -> (B, H, N, d_k)."""
        B, N, _ = x.shape
        return x.view(B, N, self.num_heads, self.d_k).transpose(1, 2)

    def forward(
        self,
        Q: torch.Tensor,
        K: torch.Tensor,
        V: torch.Tensor,
        mask: torch.Tensor | None = None,
        use_projections: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Handle unbatched input
        if Q.dim() == 2:
            Q = Q.unsqueeze(0)
            K = K.unsqueeze(0)
            V = V.unsqueeze(0)

        # Optional learned projections
        if use_projections:
            Q = self.W_Q(Q)
            K = self.W_K(K)
            V = self.W_V(V)

        # Split into heads: (B, N, d_model) -> (B, H, N, d_k)
        Q_h = self.split_heads(Q)
        K_h = self.split_heads(K)
        V_h = self.split_heads(V)

        # Scaled dot-product per head
        scores = torch.matmul(Q_h, K_h.transpose(-2, -1)) / self.scale

        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))

        weights = F.softmax(scores, dim=-1)  # (B, H, N, N)
        head_out = torch.matmul(weights, V_h)  # (B, H, N, d_k)

        # Concatenate heads: (B, H, N, d_k) -> (B, N, d_model)
        B, H, N, d_k = head_out.shape
        output = head_out.transpose(1, 2).contiguous().view(B, N, H * d_k)

        if use_projections:
            output = self.W_O(output)

        return weights.squeeze(0), output.squeeze(0)
