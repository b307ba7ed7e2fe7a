"""Configs through the analysis, against independent references (numpy by hand, PyTorch)."""

import numpy as np
import pytest
import torch

from mha_trace.analyses.analysis import analyse
from mha_trace.analyses.walk import walk
from mha_trace.runs.config import Config, load_config
from mha_trace.runs.run import from_config


def numpy_mha(Q, K, V, heads, W_O=None, mask=None):
    """Multi-head attention on explicit Q, K, V, written out with numpy alone."""
    T, D = Q.shape
    d_k = D // heads
    weights, outs = [], []
    for h in range(heads):
        cols = slice(h * d_k, (h + 1) * d_k)
        s = Q[:, cols] @ K[:, cols].T / np.sqrt(d_k)
        if mask is not None:
            s = np.where(mask, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        w = e / e.sum(-1, keepdims=True)
        weights.append(w)
        outs.append(w @ V[:, cols])
    concat = np.hstack(outs)
    return np.stack(weights), concat @ (np.eye(D) if W_O is None else W_O)


def explicit(T, D, heads, seed, W_O=False, mask="none"):
    rng = np.random.default_rng(seed)
    Q, K, V = (rng.normal(size=(T, D)) for _ in range(3))
    wo = rng.normal(size=(D, D)) if W_O else None
    tup = lambda m: tuple(map(tuple, m.tolist()))
    c = Config("random", "random", "random", "", tuple(f"t{i}" for i in range(T)), heads, D,
               mask=mask, Q=tup(Q), K=tup(K), V=tup(V), W_O=None if wo is None else tup(wo))
    return c, Q, K, V, wo


@pytest.mark.parametrize("seed", range(6))
def test_random_explicit_configs_match_numpy(seed):
    rng = np.random.default_rng(100 + seed)
    T, heads = int(rng.integers(2, 8)), int(rng.choice([1, 2, 3, 4]))
    D = heads * int(rng.integers(1, 4))
    mask = "causal" if seed % 2 else "none"
    c, Q, K, V, wo = explicit(T, D, heads, seed, W_O=seed % 3 == 0, mask=mask)
    view = analyse(from_config(c))
    m = np.tril(np.ones((T, T), bool)) if mask == "causal" else None
    weights, output = numpy_mha(Q, K, V, heads, wo, m)
    np.testing.assert_allclose(view.weights, weights, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(view.output, output, rtol=1e-12, atol=1e-12)
    for i in range(T):  # the walk-through recomputes each row by hand and must agree
        np.testing.assert_allclose(walk(view, i).output, output[i], rtol=1e-12, atol=1e-12)


def test_resplitting_the_chapter_example_into_4_heads():
    base = load_config()
    view = analyse(from_config(base.with_overrides(heads=4)))
    Q, K, V = (np.array(m) for m in (base.Q, base.K, base.V))
    weights, output = numpy_mha(Q, K, V, 4)
    np.testing.assert_allclose(view.weights, weights, atol=1e-12)
    # d_k = 1: each score is a scalar product, so a query row only rescales one key column
    assert view.d_k == 1


@pytest.mark.parametrize("name", ["chicken-road", "animal-street"])
def test_generated_configs_match_torch_multihead_attention(name):
    config = load_config(name)
    run = from_config(config)
    module, x = run.module, run.x
    ref = torch.nn.MultiheadAttention(config.d_model, config.heads, bias=False,
                                      batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([module.W_q.weight, module.W_k.weight,
                                            module.W_v.weight]))
        ref.out_proj.weight.copy_(module.W_o.weight)
    causal = config.mask == "causal"
    T = len(config.tokens)
    attn_mask = torch.ones(T, T, dtype=torch.bool).triu(1) if causal else None  # True = blocked
    ref_out, ref_w = ref(x, x, x, attn_mask=attn_mask, average_attn_weights=False)
    view = analyse(from_config(config))
    np.testing.assert_allclose(view.output, ref_out[0].detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(view.weights, ref_w[0].detach().numpy(), rtol=1e-10, atol=1e-12)


def test_generated_configs_are_deterministic():
    a, b = analyse(from_config(load_config("chicken-road"))), analyse(from_config(load_config("chicken-road")))
    np.testing.assert_array_equal(a.output, b.output)
    assert a.weights.shape == (8, 11, 11)


def test_pad_masks_the_last_keys():
    view = analyse(from_config(load_config().with_overrides(pad=2)))
    assert (view.weights[:, :, 3:] == 0).all()
    np.testing.assert_allclose(view.weights.sum(-1), 1.0)
