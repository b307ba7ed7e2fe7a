"""Multi-head latent attention (DeepSeek-V2's MLA), the lecture's `LatentAttention`: its absorbed form
equals its naive form, both equal MLA written out in NumPy here and transformers' DeepseekV3Attention
on the same weights (a kept fixture: tests/fixtures/make_scoring_reference.py), and the command line
traces, verifies and refuses it."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_trace.core.latent_attention import LatentAttention
from mha_trace.analyses.references import numpy_rope

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "scoring_reference.json").read_text())


def mla_by_hand(m, x: np.ndarray, keep) -> tuple:
    """DeepSeek-V2's equations (9)-(19), no query latent: c = RMSNorm(W_DKV x), k_C = W_UK c,
    v = W_UV c, k_R = RoPE(W_KR x) shared, q = [q_C, RoPE(q_R)]; (output, weights)."""
    w = {k: v.detach().double().numpy() for k, v in m.state_dict().items()}
    T, H, d_h, d_r, d_c = len(x), m.heads, m.nope_dim, m.rope_dim, m.kv_rank
    q = (x @ w["W_q.weight"].T).reshape(T, H, d_h + d_r).transpose(1, 0, 2)
    down = x @ w["W_dkv.weight"].T
    c = down[:, :d_c] / np.sqrt((down[:, :d_c] ** 2).mean(-1, keepdims=True) + 1e-6) * w["kv_norm.weight"]
    k_r = numpy_rope(down[None, :, d_c:], m.rope_base)[0]
    heads = lambda t, n: t.reshape(T, H, n).transpose(1, 0, 2)
    k_c, v = heads(c @ w["W_uk.weight"].T, d_h), heads(c @ w["W_uv.weight"].T, m.v_dim)
    s = (q[..., :d_h] @ k_c.transpose(0, 2, 1) + numpy_rope(q[..., d_h:], m.rope_base) @ k_r.T) / math.sqrt(d_h + d_r)
    e = np.exp(np.where(keep, s, -np.inf) if keep is not None else s)
    weights = e / e.sum(-1, keepdims=True)
    return (weights @ v).transpose(1, 0, 2).reshape(T, -1) @ w["W_o.weight"].T, weights


@pytest.mark.parametrize("sizes", [dict(d_model=48, heads=4, kv_rank=12, rope_dim=4),
                                   dict(d_model=32, heads=2, kv_rank=8, rope_dim=8, nope_dim=6, v_dim=10)])
@pytest.mark.parametrize("causal", [False, True])
def test_the_naive_and_absorbed_forms_are_mla_by_hand(sizes, causal):
    torch.manual_seed(2)
    m = LatentAttention(**sizes).double()
    with torch.no_grad():
        m.kv_norm.weight.copy_(torch.rand(m.kv_rank) + 0.5)  # a gain the test can see
    x = torch.randn(1, 9, sizes["d_model"], dtype=torch.float64)
    keep = np.tril(np.ones((9, 9), bool)) if causal else None
    mask = None if keep is None else torch.from_numpy(keep)
    ref_out, ref_w = mla_by_hand(m, x[0].numpy(), keep)
    for absorbed in (False, True):
        m.absorbed = absorbed
        out, weights = m(x, mask)
        np.testing.assert_allclose(out[0].detach().numpy(), ref_out, atol=1e-10)
        np.testing.assert_allclose(weights[0].detach().numpy(), ref_w, atol=1e-12)


@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_gives_deepseek_v3s_numbers(absorbed):
    f, case = FIXTURE, FIXTURE["deepseek"]
    m = LatentAttention(f["d_model"], f["heads"], rope_base=f["rope_base"], absorbed=absorbed, **case["sizes"]).double()
    m.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in case["weights"].items()})
    T = f["tokens"]
    with torch.no_grad():
        out, weights = m(torch.tensor(case["input"], dtype=torch.float64)[None], torch.ones(T, T, dtype=torch.bool).tril())
    np.testing.assert_allclose(out[0].numpy(), case["output"], atol=1e-5)  # its RMSNorm runs in float32
    np.testing.assert_allclose(weights[0].numpy(), case["attention"], atol=1e-5)


def test_shapes_traces_the_latent_and_the_absorbed_form(cli):
    naive = " ".join(cli("shapes", "--latent", "16", "--d-model", "64", "--heads", "4", "--width", "120").stdout.split())
    assert "self.W_dkv(x)" in naive and "self.kv_norm(c)" in naive and "self.W_uk(c)" in naive
    assert "24 numbers a token and layer, against 128 (2·H·d_k)" in naive
    absorbed = cli("shapes", "--latent", "16", "--absorbed", "--d-model", "64", "--heads", "4", "--width", "120").stdout
    assert "einsum" in absorbed and "self.W_uk(c)" not in absorbed and "self.W_uv(c)" not in absorbed
    data = json.loads(cli("shapes", "--latent", "16", "--rope-dim", "4", "--format", "json").stdout)
    assert any(s["source"].startswith("c, k_r = self.W_dkv(x)") and s["shape"][-1] == 20
                                for s in data["steps"])


def test_verify_holds_both_forms_to_the_references(cli):
    for extra in ((), ("--absorbed",)):
        data = json.loads(cli("verify", "--latent", "16", "--mask", "causal", "--dtype", "float64", *extra,
                              "--format", "json").stdout)
        assert data["passed"] is True
        refs = {c["reference"] for c in data["checks"] if c["max_abs_diff"] is not None}
        assert {"numpy by hand, float64", "F.scaled_dot_product_attention"} <= refs and len(refs) == 3


def test_the_api_traces_and_verifies_mla():
    import mha_trace

    assert any(s.op == "einsum" for s in mha_trace.trace_sizes(latent=16, absorbed=True, d_model=64, heads=4).steps)
    assert mha_trace.verify(latent=16, d_model=64, heads=4, dtype="float64").passed


@pytest.mark.parametrize("args, says", [
    (("shapes", "--latent", "16", "--kv-heads", "2"), "--latent does not go with --kv-heads"),
    (("shapes", "--latent", "16", "--impl", "sdpa"), "--latent does not go with --impl sdpa"),
    (("shapes", "--rope-dim", "8"), "--rope-dim sizes MLA's decoupled RoPE key: add --latent"),
    (("shapes", "--latent", "16", "--rope-dim", "7"), "--rope-dim 7 must be an even number"),
    (("shapes", "--latent", "16", "--compact"), "--compact does not go with --latent"),
    (("shapes", "--latent", "16", "--config", "chicken-road"), "--latent builds the lecture's MLA module"),
    (("verify", "--latent", "16", "--module", "example:l04"), "grading a class of your own as MLA is not built yet"),
])
def test_mla_refusals(cli, args, says):
    result = cli(*args)
    assert result.exit_code != 0 and says in result.stderr and "Traceback" not in result.stderr
