"""Lecture experiments: head counts, ablation, W_O mixing, masks, GQA and MQA."""

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha_trace.analyses.analysis import ablate_heads, analyse, analyse_splits
from mha_trace.runs.config import load_config
from mha_trace.runs.resolve import RunOptions, resolve_splits
from mha_trace.runs.run import from_config


def chapter_qkv():
    c = load_config()
    return c, *(torch.tensor(m, dtype=torch.float64) for m in (c.Q, c.K, c.V))


def sdpa_heads(Q, K, V, heads, kv_heads=None, **kwargs):
    """The chapter's column-slice heads through F.scaled_dot_product_attention: (T, D)."""
    T, D = Q.shape
    d_k, G = D // heads, kv_heads or heads
    q = Q.view(1, T, heads, d_k).transpose(1, 2)
    k = K[:, :G * d_k].reshape(1, T, G, d_k).transpose(1, 2)
    v = V[:, :G * d_k].reshape(1, T, G, d_k).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=G != heads, **kwargs)
    return out.transpose(1, 2).reshape(T, D).numpy()


@pytest.mark.parametrize("heads,kv_heads", [(2, 1), (4, 2), (4, 1)])
def test_gqa_and_mqa_heads_match_sdpa(heads, kv_heads):
    c, Q, K, V = chapter_qkv()
    view = analyse(from_config(c.with_overrides(heads=heads, kv_heads=kv_heads)))
    np.testing.assert_allclose(view.output, sdpa_heads(Q, K, V, heads, kv_heads), atol=1e-12)
    assert [view.kv_head_of(h) for h in range(heads)] == [h // (heads // kv_heads) for h in range(heads)]


def test_causal_heads_match_sdpa_is_causal():
    c, Q, K, V = chapter_qkv()
    view = analyse(from_config(c.with_overrides(mask="causal")))
    np.testing.assert_allclose(view.output, sdpa_heads(Q, K, V, 2, is_causal=True), atol=1e-12)
    assert np.all(np.triu(view.weights[0], 1) == 0)


def test_padding_matches_sdpa_attn_mask():
    c, Q, K, V = chapter_qkv()
    view = analyse(from_config(c.with_overrides(pad=2)))
    keep = torch.ones(5, 5, dtype=torch.bool)
    keep[:, 3:] = False
    np.testing.assert_allclose(view.output, sdpa_heads(Q, K, V, 2, attn_mask=keep), atol=1e-12)


def test_compare_against_numpy_per_head_count():
    c, Q, K, V = chapter_qkv()
    for view in analyse_splits(resolve_splits(RunOptions(config=c), [1, 2, 4])):
        np.testing.assert_allclose(view.output, sdpa_heads(Q, K, V, view.heads), atol=1e-12)
    single = analyse_splits(resolve_splits(RunOptions(config=c), [1]))[0]
    # the chapter's single-head numbers for "cat": 0.4026 to "The", 0.2442 to "sat", 0.0898 itself
    assert list(np.round(single.weights[0][1][:3], 4)) == [0.4026, 0.0898, 0.2442]


def test_ablation_against_numpy():
    for name in ("cat-sat-on-mat", "permuted-wo"):
        c = load_config(name)
        view = analyse(from_config(c))
        concat = view.concat.copy()
        concat[:, 2:4] = 0.0  # head 2 removed
        expected = concat @ view.W_O
        a = ablate_heads(from_config(c), [2])
        np.testing.assert_allclose(a.output, expected, atol=1e-12)
        np.testing.assert_allclose(a.distance, np.linalg.norm(expected - view.output, axis=1))
        assert a.total == pytest.approx(np.linalg.norm(expected - view.output))
    both = ablate_heads(from_config(load_config()), [1, 2])
    np.testing.assert_allclose(both.output, 0.0)
    assert both.total_relative == pytest.approx(1.0)


def test_permuted_wo_moves_head_outputs_across_dims():
    view = analyse(from_config(load_config("permuted-wo")))
    np.testing.assert_allclose(view.output[:, 0:2], view.concat[:, 2:4])
    np.testing.assert_allclose(view.output[:, 2:4], view.concat[:, 0:2])
    assert not view.wo_identity


GOLDEN_RUNS = {
    "screens/compare-100x30.txt": ("compare",),
    "screens/ablate-head-2-100x30.txt": ("ablate",),
    "ablate_permuted_wo.txt": ("ablate", "--config", "permuted-wo", "--head", "1"),
    "heads_gqa.txt": ("heads", "--heads", "4", "--kv-heads", "2"),
    "explain_gqa_causal.txt": ("explain", "--token", "sat", "--kv-heads", "1", "--mask", "causal"),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
@pytest.mark.slow
def test_experiment_views_match_golden(golden_run, name):
    golden_run(name, GOLDEN_RUNS[name])


def test_json_for_every_experiment(cli):
    data = json.loads(cli("compare", "--heads", "1,4", "--format", "json").stdout)
    assert [r["heads"] for r in data["runs"]] == [1, 4] and data["runs"][1]["d_k"] == 1
    data = json.loads(cli("ablate", "--head", "1", "--format", "json").stdout)
    assert data["removed"] == [1] and len(data["per_token_l2"]) == 5
    data = json.loads(cli("heads", "--kv-heads", "1", "--format", "json").stdout)
    assert [h["kv_head"] for h in data["heads"]] == [1, 1]
    data = json.loads(cli("explain", "--mask", "causal", "--token", "The", "--format", "json").stdout)
    assert [k["masked"] for k in data["heads"][0]["keys"]] == [False, True, True, True, True]
    data = json.loads(cli("compare", "--pad", "1", "--format", "json").stdout)
    assert all(row[-1] == 0.0 for run in data["runs"] for w in run["weights"] for row in w)


def test_masked_keys_in_explain_are_marked(cli):
    out = cli("explain", "--token", "cat", "--mask", "causal").stdout
    assert out.count("· masked") == 2 * 3  # 2 heads × keys sat, on, mat


@pytest.mark.parametrize("args,message", [
    (("ablate", "--head", "3"), "--head 3 is out of range (this config has heads 1 to 2)"),
    (("ablate", "--head", ""), "--head: needs at least one number, e.g. 1,2,4"),
    (("ablate", "--head", "x"), "--head: expected comma-separated integers like 1,2,4, got 'x'"),
    (("compare", "--heads", "3,8"), "--heads 3, 8 do not divide d_model=4 (valid head counts: 1, 2, 4)"),
    (("compare", "--heads", "0"), "--heads 0 does not divide d_model=4 (valid head counts: 1, 2, 4)"),
    (("heads", "--kv-heads", "3"), "--kv-heads: heads=2 is not divisible by kv_heads=3 (valid kv-head counts: 1, 2)"),
    (("compare", "--pad", "5"), "--pad: pad=5 must be at least 0 and less than seq=5 (every query needs one key it may look at)"),
    (("shapes", "--pad", "12", "--seq", "12"), "--pad: pad=12 must be at least 0 and less than seq=12 (every query needs one key it may look at)"),
])
def test_experiment_bad_input(cli, args, message):
    result = cli(*args)
    assert result.exit_code == 2
    assert result.stderr == f"Error: {message}\n"
