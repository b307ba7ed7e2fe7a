""""Code It Like You Mean It", as written: forward(x, mask) and a module-level helper."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        assert d_model % num_heads == 0, "d_model must be divisible by num_heads"

        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads  # Depth of each head's Q, K, V

        # These linear layers project into *all heads at once*.
        # We'll split the result later. It's more efficient this way.
        self.w_q = nn.Linear(d_model, d_model)  # Projects to (num_heads * d_k)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)  # Output projection

    def forward(self, x, mask=None):
        batch_size, seq_len, d_model = x.size()

        # Linear projection and then split into heads
        # Shape: (batch_size, seq_len, d_model) -> (batch_size, seq_len, num_heads, d_k)
        q = self.w_q(x).view(batch_size, seq_len, self.num_heads, self.d_k)
        k = self.w_k(x).view(batch_size, seq_len, self.num_heads, self.d_k)
        v = self.w_v(x).view(batch_size, seq_len, self.num_heads, self.d_k)

        # Transpose to get dimensions: (batch_size, num_heads, seq_len, d_k)
        # This allows us to compute attention for each head in parallel
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)

        # Compute scaled dot-product attention (we'll write this function)
        # attn_output shape: (batch_size, num_heads, seq_len, d_k)
        attn_output, attn_weights = scaled_dot_product_attention(q, k, v, mask)

        # Concatenate heads: transpose back to (batch_size, seq_len, num_heads, d_k)
        # then reshape to (batch_size, seq_len, d_model)
        concat_output = attn_output.transpose(1, 2).contiguous().view(batch_size, seq_len, d_model)

        # Final output projection
        output = self.w_o(concat_output)

        return output, attn_weights


def scaled_dot_product_attention(q, k, v, mask=None):
    # q, k, v shapes: (batch_size, ..., seq_len, d_k)
    # '...' could be num_heads, for example

    # Compute attention scores
    matmul_qk = torch.matmul(q, k.transpose(-2, -1))  # (..., seq_len, seq_len)

    # Scale scores
    d_k = q.size()[-1]
    scaled_scores = matmul_qk / (d_k ** 0.5)

    # Apply mask (if provided) - crucial for decoder to prevent cheating
    if mask is not None:
        scaled_scores = scaled_scores.masked_fill(mask == 0, -1e9)

    # Softmax to get attention weights
    attn_weights = F.softmax(scaled_scores, dim=-1)  # (..., seq_len, seq_len)

    # Weighted sum of values
    output = torch.matmul(attn_weights, v)  # (..., seq_len, d_k)

    return output, attn_weights
