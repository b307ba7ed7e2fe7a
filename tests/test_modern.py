"""RoPE, sliding windows, the fused SDPA path and KV-cache decoding, against references the tool
does not compute itself: RoPE by hand in numpy (and its relative-position property), windows
built with np.tril / np.triu, SDPA with an explicit mask, and a full causal pass for decoding.
"""

import json
import math

import numpy as np
import pytest
import torch

from mha_trace.core.attention import KVCache, MultiHeadAttention, rope
from mha_trace.runs.config import load_config
from mha_trace.runs.run import Sizes, from_sizes
from mha_trace.analyses.shapes import trace_run
from mha_trace.analyses.references import numpy_rope


def test_rope_is_the_rotate_half_pairing_by_hand():
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    np.testing.assert_allclose(rope(x, 0, 10000.0).numpy(), numpy_rope(x.numpy(), 10000.0), atol=1e-12)
    # decoding: a token at position 5 is turned as the 6th token of a full sequence
    np.testing.assert_allclose(rope(x[:, :, 5:6], 5, 500.0).numpy(),
                               numpy_rope(x.numpy(), 500.0)[:, :, 5:6], atol=1e-12)


def test_rope_scores_depend_only_on_the_distance():
    """First principles: turning q by m·θ and k by n·θ leaves q·k a function of m - n."""
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16, dtype=torch.float64)
    dot = lambda m, n: float((rope(q, m, 10000.0) * rope(k, n, 10000.0)).sum())
    assert dot(7, 3) == pytest.approx(dot(104, 100), abs=1e-9)
    assert dot(0, 0) == pytest.approx(float((q * k).sum()), abs=1e-12)  # position 0 is not turned
    assert abs(dot(7, 3) - dot(7, 4)) > 1e-6


@pytest.mark.parametrize("kv_heads", [None, 2])
@pytest.mark.parametrize("rope_on", [False, True])
@pytest.mark.parametrize("window", [None, 3])
def test_decoding_equals_the_full_causal_pass(kv_heads, rope_on, window):
    torch.manual_seed(0)
    m = MultiHeadAttention(32, 4, kv_heads, rope=rope_on, window=window).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    with torch.no_grad():
        full, _ = m(x, mask=causal)
        cache = KVCache()
        outs = [m(x[:, :5], mask=causal[:5, :5], cache=cache)[0]]
        outs += [m(x[:, t:t + 1], cache=cache)[0] for t in range(5, 9)]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=0, atol=1e-12)
    assert len(cache) == 9 and cache.k.shape == (2, kv_heads or 4, 9, 8)


@pytest.mark.parametrize("kwargs", [{}, {"kv_heads": 2}, {"window": 3}, {"rope": True},
                                    {"rope": True, "window": 2, "kv_heads": 1}])
def test_fused_and_explicit_paths_give_the_same_output(kwargs):
    torch.manual_seed(1)
    m = MultiHeadAttention(32, 4, **kwargs).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    mask = torch.ones(7, 7, dtype=torch.bool).tril()
    with torch.no_grad():
        explicit, weights = m(x, mask=mask)
        m.impl = "sdpa"
        fused, none = m(x, mask=mask)
    torch.testing.assert_close(fused, explicit, rtol=0, atol=1e-12)
    assert none is None and weights is not None


def test_window_weights_against_a_band_built_by_hand(cli):
    data = json.loads(cli("heads", "--window", "2", "--mask", "causal", "--format", "json",
                          "--decimals", "12").stdout)
    band = np.tril(np.ones((5, 5), bool)) & np.triu(np.ones((5, 5), bool), -1)
    assert np.array_equal(np.array(data["mask"]), band)
    c = load_config("cat-sat-on-mat")
    Q, K = np.array(c.Q), np.array(c.K)
    for h, head in enumerate(data["heads"]):
        cols = slice(2 * h, 2 * h + 2)
        s = np.where(band, Q[:, cols] @ K[:, cols].T / math.sqrt(2), -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(head["weights"], e / e.sum(-1, keepdims=True), atol=1e-11)


def test_rope_on_the_chapter_example_by_hand(cli):
    data = json.loads(cli("heads", "--rope", "--format", "json", "--decimals", "12").stdout)
    c = load_config("cat-sat-on-mat")
    Q, K = np.array(c.Q), np.array(c.K)
    for h, head in enumerate(data["heads"]):
        cols = slice(2 * h, 2 * h + 2)
        q = numpy_rope(Q[None, :, cols], 10000.0)[0]
        k = numpy_rope(K[None, :, cols], 10000.0)[0]
        s = q @ k.T / math.sqrt(2)
        e = np.exp(s - s.max(-1, keepdims=True))
        np.testing.assert_allclose(head["weights"], e / e.sum(-1, keepdims=True), atol=1e-11)
    plain = json.loads(cli("heads", "--format", "json", "--decimals", "12").stdout)
    assert plain["heads"][0]["weights"] != data["heads"][0]["weights"]  # the weights do change


def test_explain_with_rope_walks_the_rotated_products(cli):
    walk = json.loads(cli("explain", "--rope", "--token", "cat", "--format", "json", "--decimals",
                          "12").stdout)
    heads = json.loads(cli("heads", "--rope", "--format", "json", "--decimals", "12").stdout)
    for wh, hh in zip(walk["heads"], heads["heads"]):
        np.testing.assert_allclose([k["weight"] for k in wh["keys"]], hh["weights"][1], atol=1e-11)


@pytest.mark.parametrize("args", [("--rope",), ("--window", "3"), ("--impl", "sdpa", "--mask", "causal"),
                                  ("--rope", "--window", "4", "--kv-heads", "2"),
                                  ("--rope", "--impl", "sdpa", "--kv-heads", "2", "--window", "3"),
                                  ("--config", "chicken-road", "--rope", "--window", "3")])
def test_verify_covers_the_modern_options(cli, args):
    data = json.loads(cli("verify", *args, "--dtype", "float64", "--format", "json").stdout)
    assert data["passed"] is True
    measured = [c for c in data["checks"] if c["max_abs_diff"] is not None]
    assert {c["reference"] for c in measured} >= {"numpy by hand, float64", "F.scaled_dot_product_attention"}


def test_verify_fails_a_wrong_rope(monkeypatch):
    import mha_trace.core.attention as attention

    monkeypatch.setattr(attention, "rope", lambda x, start, base, dims=None: x)  # forgets to turn
    torch.manual_seed(0)
    m = attention.MultiHeadAttention(32, 4, rope=True).double()
    from mha_trace.analyses.references import run_checks

    x = torch.randn(1, 6, 32, dtype=torch.float64)
    checks = run_checks(m, x, x, x, None, "float64")
    assert all(c.passed is False for c in checks if c.max_abs is not None)


@pytest.mark.slow
def test_decode_trace_shows_the_growing_cache():
    report = trace_run(from_sizes(Sizes(batch=2, seq=4, d_model=64, heads=4, kv_heads=2,
                                        mask="causal", decode=3)))
    phases = [s.phase for s in report.steps]
    assert phases[0] == "prefill" and phases[-1] == "decode step 3"
    cats = [s for s in report.steps if s.op == "cat"]
    assert [s.shape for s in cats] == [(2, 2, 5, 16)] * 2 + [(2, 2, 6, 16)] * 2 + [(2, 2, 7, 16)] * 2
    scores = [s.shape for s in report.steps if s.op == "matmul" and s.shape[-1] != 16]
    assert scores == [(2, 4, 4, 4), (2, 4, 1, 5), (2, 4, 1, 6), (2, 4, 1, 7)]
    queries = [s.shape for s in report.steps if s.op == "transpose" and s.shape[1] == 4 and s.shape[-1] == 16]
    assert (2, 4, 1, 16) in queries
    # the cache sizes the summary gives are the traced K and V, each step
    by_phase = {p: b for p, _, b in report.kv_cache_by_phase}
    for phase, size in by_phase.items():
        if phase != "prefill":
            assert size == sum(s.bytes for s in cats if s.phase == phase)


def test_decode_on_meta_at_gpt3_scale(cli):
    result = cli("shapes", "--device", "meta", "--batch", "1", "--seq", "2048", "--d-model", "12288",
                 "--heads", "96", "--kv-heads", "8", "--decode", "2", "--format", "json")
    assert result.exit_code == 0, result.stderr
    cats = [s["shape"] for s in json.loads(result.stdout)["steps"] if s["op"] == "cat"]
    assert cats == [[1, 8, 2049, 128]] * 2 + [[1, 8, 2050, 128]] * 2


def test_fused_path_notes_and_compare(cli):
    out = cli("shapes", "--impl", "sdpa", "--compare-impl", "--mask", "causal").stdout
    assert "never forms the [2, 8, 10, 10] scores or weights" in out
    assert "Never materialised by the fused path: row 12 matmul [2, 8, 10, 10] 6.2 KiB" in out
    data = json.loads(cli("shapes", "--impl", "sdpa", "--compare-impl", "--format", "json").stdout)
    assert data["compare_impl"]["sdpa_bytes"] < data["compare_impl"]["explicit_bytes"]
    assert not any(s["shape"][-2:] == [10, 10] for s in data["steps"])


@pytest.mark.parametrize("args", [("--rope",), ("--window", "3"), ("--impl", "sdpa"),
                                  ("--decode", "2", "--kv-heads", "2"), ("--rope", "--impl", "sdpa")])
def test_the_guard_counts_modern_runs_by_a_meta_trace(args, cli):
    data = json.loads(cli("shapes", *args, "--format", "json").stdout)
    params = data["summary"]["parameters"] * 4
    # the meta trace's count: exact, or an upper bound where the CPU kernel skips a copy
    assert data["summary"]["estimated_peak_bytes"] >= params + data["summary"]["bytes_allocated"]
    assert data["summary"]["estimated_peak_bytes"] <= params + data["summary"]["bytes_allocated"] + 2 * 10 * 512 * 4


def test_mistral_cache_honours_its_window(cli):
    rows = {r["item"]: r for r in json.loads(cli("cost", "--preset", "mistral-7b", "--seq", "8192",
                                                 "--dtype", "float16", "--format", "json").stdout)["rows"]}
    assert rows["KV cache, batch × layers × 4096 tokens (window)"]["total"] == 2 * 8 * 128 * 2 * 32 * 4096
    band = 4096 * 4097 // 2 + (8192 - 4096) * 4096  # query i sees min(i + 1, 4096) keys
    assert rows["scores, sliding window 4096 (band only)"]["total"] == 32 * band * 2
    text = cli("cost", "--preset", "mistral-7b").stdout
    assert "RoPE adds no parameters" in text and "FlashAttention-2" in text


@pytest.mark.parametrize("args,message", [
    (("shapes", "--rope", "--d-model", "12", "--heads", "4"),
     "--rope turns pairs of dims, so d_k = d_model / heads = 3 must be even (try --heads 1, 2, 3, 6)"),
    (("shapes", "--compare-impl"), "--compare-impl goes with --impl sdpa or tiled (it compares that "
                                   "path with the explicit one)"),
    (("shapes", "--decode", "2", "--pad", "1"), "--pad does not go with --decode (decoding appends real tokens)"),
    (("shapes", "--window", "0"), "--window: window=0 must be a positive integer (at least 1)"),
    (("shapes", "--module", "examples/l04_mha.py:MultiHeadAttention", "--rope"),
     "--module: --rope, --window, --impl, --decode, --kv-heads and the scores' variants (--qk-norm, --alibi, --softcap, "
     "--sink-logits, --off-by-one, --diff) set up the built-in module; your class decides its own"),
    (("verify", "--config", "cat-sat-on-mat", "--impl", "sdpa"),
     "--impl goes with sizes from flags (a config runs the explicit module)"),
])
def test_modern_option_errors(cli, args, message):
    result = cli(*args)
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")
