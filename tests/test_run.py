"""The run setup (mha_trace/run.py) against independent references.

Each test here checks a number the tool computes against something it does not compute itself:
torch's own SDPA with is_causal, torch's element sizes, numpy written out by hand. They are the
tests that catch the bugs we fear most: a mask one key off, a dtype counted at the wrong width, a
reference compared with itself, a KV cache missing its factor 2, an average that drops a head.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha_trace.analyses.analysis import analyse
from mha_trace.core.attention import MultiHeadAttention
from mha_trace.runs.config import load_config
from mha_trace.core.costs import forward_bytes, parameters
from mha_trace.runs.run import Sizes, from_config, from_sizes, make_mask
from mha_trace.analyses.shapes import trace_run
from mha_trace.analyses.references import run_checks


@pytest.mark.parametrize("T", [1, 2, 7])
def test_causal_mask_is_numpy_tril(T):
    assert np.array_equal(make_mask(T, "causal").numpy(), np.tril(np.ones((T, T), bool)))


def test_padding_mask_hides_exactly_the_last_keys():
    keep = make_mask(5, "none", pad=2).numpy()
    assert keep.tolist() == [[True, True, True, False, False]] * 5
    both = make_mask(5, "causal", pad=2).numpy()
    assert np.array_equal(both, np.tril(np.ones((5, 5), bool)) & keep)


@pytest.mark.parametrize("kv_heads", [None, 2])
def test_causal_run_from_flags_matches_sdpa_is_causal(kv_heads):
    """SDPA builds its own causal mask: a mask that lets a query see one key ahead fails here."""
    run = from_sizes(Sizes(batch=2, seq=6, d_model=32, heads=4, kv_heads=kv_heads, mask="causal",
                           dtype="float64"))
    out, weights = run.forward()
    m, x = run.module, run.x
    B, T, H, G, d_k = 2, 6, 4, kv_heads or 4, 8
    with torch.no_grad():
        Q = m.W_q(x).view(B, T, H, d_k).transpose(1, 2)
        K = m.W_k(x).view(B, T, G, d_k).transpose(1, 2)
        V = m.W_v(x).view(B, T, G, d_k).transpose(1, 2)
        ref = F.scaled_dot_product_attention(Q, K, V, is_causal=True, enable_gqa=G != H)
        ref = m.W_o(ref.transpose(1, 2).reshape(B, T, H * d_k))
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    assert torch.all(weights.triu(1) == 0)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
@pytest.mark.slow
def test_traced_bytes_use_torchs_own_element_size(dtype):
    torch_dtype = getattr(torch, dtype)
    size = torch.empty(0, dtype=torch_dtype).element_size()
    report = trace_run(from_sizes(Sizes(seq=4, d_model=16, heads=2, dtype=dtype)))
    for s in report.steps:
        if s.dtype == dtype:
            assert s.bytes == (0 if s.is_view else math.prod(s.shape) * size), s
    params = sum(p.numel() * p.element_size() for p in report.run.module.parameters())
    d = report.sizes.dims()
    assert sum(parameters(d).values()) * d.itemsize == params
    assert report.estimate == params + report.bytes_allocated


@pytest.mark.parametrize("sizes", [
    Sizes(), Sizes(heads=1), Sizes(seq=1), Sizes(heads=1, seq=1), Sizes(pad=3), Sizes(mask="causal"),
    Sizes(mask="causal", pad=2, kv_heads=2), Sizes(batch=1, seq=1, mask="causal"),
    Sizes(dtype="bfloat16", kv_heads=1), Sizes(seq=3, pad=1, heads=1),
], ids=repr)
@pytest.mark.slow
def test_memory_estimate_equals_what_the_traced_run_allocates(sizes):
    report = trace_run(from_sizes(sizes))
    assert sum(forward_bytes(sizes.dims()).values()) == report.bytes_allocated


@pytest.mark.slow
def test_an_expanded_padding_mask_costs_its_storage():
    report = trace_run(from_sizes(Sizes(seq=50, pad=5)))
    mask = next(s for s in report.steps if s.op == "input" and s.text == "mask")
    assert mask.shape == (50, 50) and mask.bytes == 50  # one bool row, expanded


@pytest.mark.slow
def test_kv_cache_per_token_is_the_k_and_v_projections_per_token():
    """Independent of the formula: the bytes of the traced W_k and W_v outputs, per token."""
    report = trace_run(from_sizes(Sizes(batch=3, seq=5, d_model=64, heads=8, kv_heads=2)))
    linears = [s for s in report.steps if s.op == "linear"]
    k_bytes, v_bytes = linears[1].bytes, linears[2].bytes
    kv, full = report.kv_cache_per_token
    assert kv == (k_bytes + v_bytes) // (3 * 5)
    assert full == kv * 8 // 2


def _by_hand(config):
    """Every head's weights for an explicit config, in numpy, from the TOML's Q, K, V."""
    Q, K, V = (np.array(m) for m in (config.Q, config.K, config.V))
    d_k = config.d_model // config.heads
    heads = []
    for h in range(config.heads):
        cols = slice(h * d_k, (h + 1) * d_k)
        s = Q[:, cols] @ K[:, cols].T / np.sqrt(d_k)
        e = np.exp(s - s.max(-1, keepdims=True))
        heads.append(e / e.sum(-1, keepdims=True))
    return np.array(heads)


@pytest.mark.parametrize("heads", [1, 2, 4])
def test_head_average_is_the_mean_of_every_head(cli, heads):
    import json

    data = json.loads(cli("heads", "--heads", str(heads), "--format", "json", "--decimals",
                          "12").stdout)
    by_hand = _by_hand(load_config("cat-sat-on-mat").with_overrides(heads=heads))
    np.testing.assert_allclose(np.array(data["average"]), by_hand.mean(0), atol=1e-11)


class _ScaledByDk(MultiHeadAttention):
    """A classic student bug: scores divided by d_k instead of √d_k."""

    def forward(self, q, k=None, v=None, mask=None):
        k = q if k is None else k
        v = q if v is None else v
        B = q.size(0)
        Q = self.W_q(q).view(B, -1, self.heads, self.d_k).transpose(1, 2)
        K = self.W_k(k).view(B, -1, self.kv_heads, self.d_k).transpose(1, 2)
        V = self.W_v(v).view(B, -1, self.kv_heads, self.d_k).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) / self.d_k
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        context = (weights @ V).transpose(1, 2).reshape(B, -1, self.d_model)
        return self.W_o(context), weights


def test_each_reference_alone_fails_a_wrong_module():
    """No reference may compare the module with itself: each one must catch this bug."""
    torch.manual_seed(0)
    module = _ScaledByDk(32, 4).double()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    checks = run_checks(module, x, x, x, make_mask(6, "causal"), "float64")
    measured = [c for c in checks if c.max_abs is not None]
    assert {(c.reference, c.compares) for c in measured} == {
        ("numpy by hand, float64", "output"), ("numpy by hand, float64", "per-head weights"),
        ("nn.MultiheadAttention", "output"), ("nn.MultiheadAttention", "per-head weights"),
        ("F.scaled_dot_product_attention", "output")}
    assert all(c.passed is False for c in measured), [(c.reference, c.compares) for c in measured]


def test_config_run_uses_the_configs_own_q_k_v():
    config = load_config("cat-sat-on-mat")
    run = from_config(config)
    assert [t[0].tolist() for t in run.args] == [[list(r) for r in m]
                                                 for m in (config.Q, config.K, config.V)]
    np.testing.assert_allclose(analyse(run).weights, _by_hand(config), atol=1e-12)
