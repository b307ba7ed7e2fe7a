"""The module against PyTorch's own attention, with the same weights."""

import math

import pytest
import torch
import torch.nn.functional as F

from mha_trace.core.attention import MultiHeadAttention


def reference(m: MultiHeadAttention, x, attn_mask=None):
    """The same attention through F.scaled_dot_product_attention (GQA via enable_gqa)."""
    B, T, D = x.shape
    q = F.linear(x, m.W_q.weight, m.W_q.bias).view(B, T, m.heads, m.d_k).transpose(1, 2)
    k = F.linear(x, m.W_k.weight, m.W_k.bias).view(B, T, m.kv_heads, m.d_k).transpose(1, 2)
    v = F.linear(x, m.W_v.weight, m.W_v.bias).view(B, T, m.kv_heads, m.d_k).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                         enable_gqa=m.kv_heads != m.heads)
    return F.linear(out.transpose(1, 2).reshape(B, T, D), m.W_o.weight, m.W_o.bias)


@pytest.mark.parametrize("heads,kv_heads", [(1, 1), (4, 4), (8, 2), (8, 1)])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_scaled_dot_product_attention(heads, kv_heads, causal):
    torch.manual_seed(1)
    m = MultiHeadAttention(32, heads, kv_heads).double()
    x = torch.randn(3, 7, 32, dtype=torch.float64)
    mask = torch.ones(7, 7, dtype=torch.bool).tril() if causal else None
    out, weights = m(x, mask=mask)
    assert weights.shape == (3, heads, 7, 7)
    torch.testing.assert_close(out, reference(m, x, mask), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, heads, 7, dtype=torch.float64))
    if causal:
        assert (weights.triu(1) == 0).all()


def test_matches_nn_multihead_attention_with_per_head_weights():
    torch.manual_seed(2)
    m = MultiHeadAttention(16, 4).double()
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([m.W_q.weight, m.W_k.weight, m.W_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([m.W_q.bias, m.W_k.bias, m.W_v.bias]))
        ref.out_proj.weight.copy_(m.W_o.weight)
        ref.out_proj.bias.copy_(m.W_o.bias)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    out, weights = m(x)
    ref_out, ref_weights = ref(x, x, x, average_attn_weights=False)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(weights, ref_weights)


def test_fully_masked_row_gives_zero_weights_not_nan():
    torch.manual_seed(3)
    m = MultiHeadAttention(8, 2)
    mask = torch.ones(4, 4, dtype=torch.bool)
    mask[2] = False  # query 2 may look at nothing
    out, weights = m(torch.randn(1, 4, 8), mask=mask)
    assert not torch.isnan(out).any() and not torch.isnan(weights).any()
    assert (weights[0, :, 2] == 0).all()
    # with no context, the row's output is the output projection's bias alone
    torch.testing.assert_close(out[0, 2], m.W_o.bias)


def test_scale_is_sqrt_d_k():
    m = MultiHeadAttention(4, 1, bias=False)
    with torch.no_grad():
        for layer in (m.W_q, m.W_k, m.W_v, m.W_o):
            layer.weight.copy_(torch.eye(4))
    x = torch.tensor([[[1.0, 0, 0, 0], [1.0, 0, 0, 0]]])
    x[0, 1, 0] = 2.0
    _, w = m(x)
    # query 0 scores keys 1·1=1 and 1·2=2, scaled by 1/sqrt(4)
    s = torch.tensor([1.0, 2.0]) / math.sqrt(4)
    torch.testing.assert_close(w[0, 0, 0], torch.softmax(s, -1))


def test_rope_at_a_tensor_position_is_rope_at_that_int_and_moves_with_it():
    """The KV-cache lab keeps its position in a 0-dim tensor (a CUDA graph replays it, and every
    layer shares it): rope there equals rope at the int, and the angles kept for the next layer
    are made again once the tensor changes in place."""
    from mha_trace.core.attention import rope

    x = torch.randn(2, 3, 1, 8)
    clock = torch.tensor(5)
    assert torch.equal(rope(x, clock, 10000.0), rope(x, 5, 10000.0))
    assert torch.equal(rope(x[:, :1], clock, 10000.0), rope(x[:, :1], 5, 10000.0))  # kept
    clock += 1
    assert torch.equal(rope(x, clock, 10000.0), rope(x, 6, 10000.0))
    assert not torch.equal(rope(x, clock, 10000.0), rope(x, 5, 10000.0))
