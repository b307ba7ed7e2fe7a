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

M = "tests/student/latent_modules.py:"
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "scoring_reference.json").read_text())


def parts_by_hand(m, x: np.ndarray) -> tuple:
    """DeepSeek-V2's equations (9)-(19), no query latent: c = RMSNorm(W_DKV x), k_C = W_UK c,
    v = W_UV c, k_R = RoPE(W_KR x) shared, q = [q_C, RoPE(q_R)]; each head's content part q_C·k_C
    and RoPE part q_R·k_R (H, T, T), and its values (H, T, d_v)."""
    w = {k: v.detach().double().numpy() for k, v in m.state_dict().items()}
    T, H, d_h, d_r, d_c = len(x), m.heads, m.nope_dim, m.rope_dim, m.kv_rank
    q = (x @ w["W_q.weight"].T).reshape(T, H, d_h + d_r).transpose(1, 0, 2)
    down = x @ w["W_dkv.weight"].T
    c = down[:, :d_c] / np.sqrt((down[:, :d_c] ** 2).mean(-1, keepdims=True) + 1e-6) * w["kv_norm.weight"]
    k_r = numpy_rope(down[None, :, d_c:], m.rope_base)[0]
    heads = lambda t, n: t.reshape(T, H, n).transpose(1, 0, 2)
    k_c, v = heads(c @ w["W_uk.weight"].T, d_h), heads(c @ w["W_uv.weight"].T, m.v_dim)
    return q[..., :d_h] @ k_c.transpose(0, 2, 1), numpy_rope(q[..., d_h:], m.rope_base) @ k_r.T, v


def mla_by_hand(m, x: np.ndarray, keep) -> tuple:
    """MLA's (output, weights) from `parts_by_hand`: the parts' sum over √(d_h + d_R), softmaxed."""
    content, position, v = parts_by_hand(m, x)
    s = (content + position) / math.sqrt(m.nope_dim + m.rope_dim)
    e = np.exp(np.where(keep, s, -np.inf) if keep is not None else s)
    weights = e / e.sum(-1, keepdims=True)
    w_o = m.W_o.weight.detach().double().numpy()
    return (weights @ v).transpose(1, 0, 2).reshape(len(x), -1) @ w_o.T, weights


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
    (("shapes", "--rope-dim", "8"), "add --rope (partial RoPE, Phi's) or --latent (MLA's decoupled RoPE key)"),
    (("shapes", "--latent", "16", "--rope-dim", "7"), "--rope-dim 7 must be an even number"),
    (("shapes", "--latent", "16", "--compact"), "--compact does not go with --latent"),
    (("heads", "--latent", "16"), "'The cat sat on mat' gives Q, K and V by hand: use a generated config"),
    (("explain", "--latent", "16", "--config", "chicken-road", "--impl", "tiled"),
     "--latent does not go with --impl tiled (MLA's walk splits each score"),
    (("explain", "--latent", "16", "--model", "minilm"), "--latent does not go with --model"),
    (("verify", "--latent", "16", "--module", "example:l04"), "MultiHeadAttention has no weights of MLA's shapes"),
    (("verify", "--latent", "16", "--module", M + "PaperMLA", "--config", "chicken-road"),
     "--latent checks your MLA class at sizes from flags"),
    (("verify", "--module", M + "PaperMLA"), "(a latent's width: multi-head latent attention? check it with --latent"),
    (("verify", "--module", M + "FusedMLA", "--init", "d_model=64, num_heads=4, kv_rank=16, rope_dim=8"),
     "your weights are multi-head latent attention's (found q_proj [96, 64], kv_a_proj_with_mqa [24, 64], "
     "kv_b_proj [128, 16], o_proj [64, 64]: keys and values come up from a latent of 16 dims): check it with "
     "--latent 16 --rope-dim 8"),
])
def test_mla_refusals(cli, args, says):
    result = cli(*args)
    assert result.exit_code != 0 and says in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("absorbed", [False, True])
def test_explain_splits_each_score_into_its_content_and_rope_parts_by_hand(cli, absorbed):
    """The walk's parts, weights and output for 'it' in every head of a generated config equal MLA
    written out in NumPy here on the module's own weights and embeddings (both forms)."""
    from mha_trace.runs.resolve import RunOptions, resolve

    form = ("--absorbed",) if absorbed else ()
    walk = json.loads(cli("explain", "--config", "animal-street", "--latent", "12", "--rope-dim", "4", *form,
                          "--token", "it", "--format", "json").stdout)
    run = resolve(RunOptions(config="animal-street", latent=12, rope_dim=4))
    x = run.x[0].numpy()
    content, position, _ = parts_by_hand(run.module, x)
    out, weights = mla_by_hand(run.module, x, np.tril(np.ones((len(x), len(x)), bool)))
    i = walk["position"]
    assert walk["config"]["latent"] == {"kv_lora_rank": 12, "qk_rope_head_dim": 4, "absorbed": absorbed}
    assert walk["sqrt_d_k"] == pytest.approx(math.sqrt(8 + 4))
    for h, head in enumerate(walk["heads"]):
        keys = head["keys"]
        np.testing.assert_allclose([k["content"] for k in keys], content[h, i], atol=1e-12)
        np.testing.assert_allclose([k["rope"] for k in keys], position[h, i], atol=1e-12)
        np.testing.assert_allclose([k["weight"] for k in keys], weights[h, i], atol=1e-12)
        assert [k["masked"] for k in keys] == [j > i for j in range(len(keys))]
    np.testing.assert_allclose(walk["output"], out[i], atol=1e-12)
    assert len(walk["heads"][0]["query"]) == (12 if absorbed else 8) + 4  # absorbed: W_UKᵀq_C is d_c wide


def test_heads_and_explain_say_what_mla_does(cli):
    heads = cli("heads", "--config", "chicken-road", "--latent", "16", "--head", "2", "--width", "100").stdout
    assert "MLA d_c 16, d_R 4" in heads and "Head 2 of 8" in heads
    text = " ".join(cli("explain", "--config", "chicken-road", "--latent", "16", "--absorbed", "--token", "it",
                        "--head", "2", "--width", "100").stdout.split())
    assert "over √(d_h + d_R) = √12" in text and "(W_UKᵀq_C)·c q_R·k_R sum ÷√12 softmax" in text
    assert "the query taken down to c's 16 dims, so no head's key is formed" in text


def test_the_api_walks_mla():
    import mha_trace

    w = mha_trace.explain(config="chicken-road", latent=16, token="road")
    assert w.view.latent.content == 8 and w.heads[0].terms[0].parts is not None
    assert mha_trace.heads(config="chicken-road", latent=16, absorbed=True).weights.shape == (8, 11, 11)


def test_ablating_an_mla_head_takes_away_its_block_of_w_o_by_hand():
    import mha_trace
    from mha_trace.runs.resolve import RunOptions, resolve

    run = resolve(RunOptions(config="chicken-road", latent=16))
    x, m = run.x[0].numpy(), run.module
    content, position, v = parts_by_hand(m, x)
    s = (content + position) / math.sqrt(m.nope_dim + m.rope_dim)
    weights = np.exp(s) / np.exp(s).sum(-1, keepdims=True)
    heads = weights @ v  # (H, T, d_v)
    heads[1] = 0  # head 2
    by_hand = heads.transpose(1, 0, 2).reshape(len(x), -1) @ m.W_o.weight.detach().numpy().T
    ablation = mha_trace.ablate(config="chicken-road", latent=16, removed=(2,))
    np.testing.assert_allclose(ablation.output, by_hand, atol=1e-12)


@pytest.mark.parametrize("cls, diagnosis, line", [
    ("PaperMLA", None, None), ("FusedMLA", None, None),
    ("NoRopePart", "the score without its RoPE part", 85), ("ScaledByDh", "scaled by √d_h, not √(d_h + d_R)", 90),
    ("NotNormed", "the latent not normed before the up-projections", 39),
    ("NotTurned", "RoPE never turned", 52), ("RopePartFirst", None, None),
    ("NotNormedNorTurned", "the latent not normed before the up-projections; and RoPE never turned", 103)])
def test_verify_grades_a_students_mla(cli, cls, diagnosis, line):
    """A student's MLA, written as the paper writes it or fused as DeepSeek's code is, is Right; one
    step wrong is Wrong at its line with the mistake named (its weights read by shape, each reading
    of the same-shaped W^UK and W^UV run)."""
    result = cli("verify", "--module", M + cls, "--latent", "16", "--rope-dim", "8", "--mask", "causal",
                 "--format", "json")
    data = json.loads(result.stdout)
    assert data["passed"] is (diagnosis is None), data
    if diagnosis:
        assert result.exit_code == 1 and data["diagnosis"].startswith(diagnosis)
        assert data["first_wrong_step"]["line"] == line
    else:
        assert "kv_b_proj.weight (by head)" in data["mapping"] if cls == "FusedMLA" else "W_UK.weight, W_UV.weight" in data["mapping"]
        assert ("RoPE part first" in data["mapping"]) is (cls == "RopePartFirst")


def test_each_mla_mistake_is_the_lectures_forward_changed_by_hand():
    """The zoo's mistaken forwards against MLA by hand: without them changed, the module's own output."""
    from mha_trace.analyses.latent_student import MISTAKES, mistaken

    torch.manual_seed(4)
    m = LatentAttention(48, 4, 12, 4).double()
    x = torch.randn(1, 9, 48, dtype=torch.float64)
    keep = np.tril(np.ones((9, 9), bool))
    np.testing.assert_allclose(mistaken(m, x, torch.from_numpy(keep))[0].numpy(), mla_by_hand(m, x[0].numpy(), keep)[0],
                               atol=1e-12)
    outputs = [mistaken(m, x, None, **way) for _, _, ways in MISTAKES for way in ways]
    assert all(not torch.allclose(o, m(x)[0]) for o in outputs) and len(MISTAKES) >= 4


def test_a_fused_up_projection_is_shown_beside_the_lectures_w_uk(cli):
    """The lecture's step beside a student's fused kv_b_proj is W^UK's (the same input, c), not W^Q's,
    whose output happens to have the fused projection's shape."""
    text = " ".join(cli("verify", "--module", M + "FusedNotNormed", "--latent", "16", "--rope-dim", "8").stdout.split())
    assert "latent_modules.py:72 kv = self.kv_b_proj" in text and "(latent_attention.py:88 return self.W_uk(c)" in text
    assert "Diagnosis: the latent not normed before the up-projections." in text
