"""QK-norm, logit soft-capping, sink logits and the off-by-one softmax: the lecture module's switches
against NumPy written here by hand, against transformers' own Qwen3, Gemma 2 and gpt-oss attention
classes (a kept fixture: tests/fixtures/make_scoring_reference.py), and through the command line."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_trace.core.attention import KVCache, MultiHeadAttention
from mha_trace.analyses.references import numpy_rope

FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "scoring_reference.json").read_text())


def by_hand(module, x: np.ndarray, keep: np.ndarray | None):
    """Attention with the module's switches, in NumPy from its weights: (output, weights)."""
    w = {k: v.detach().double().numpy() for k, v in module.state_dict().items()}
    w |= {k: b.detach().double().numpy() for k, b in module.named_buffers()}  # the off-by-one's 0
    lin = lambda name, t: t @ w[f"{name}.weight"].T + w.get(f"{name}.bias", 0)
    T, H, G, d = len(x), module.heads, module.kv_heads, module.d_k
    heads = lambda t, n: t.reshape(T, n, d).transpose(1, 0, 2)  # (n, T, d)
    Q, K, V = heads(lin("W_q", x), H), heads(lin("W_k", x), G), heads(lin("W_v", x), G)
    if module.qk_norm:
        rms = lambda t, gain: t / np.sqrt((t ** 2).mean(-1, keepdims=True) + 1e-6) * gain
        Q, K = rms(Q, w["q_norm.weight"]), rms(K, w["k_norm.weight"])
    if module.rope:  # partial RoPE: the first rope_dims of each head turn, the rest pass
        R = module.rope_dims or d
        turn = lambda t: np.concatenate([numpy_rope(t[..., :R], module.rope_base), t[..., R:]], axis=-1)
        Q, K = turn(Q), turn(K)
    K, V = K.repeat(H // G, axis=0), V.repeat(H // G, axis=0)
    s = Q @ K.transpose(0, 2, 1) / math.sqrt(d)
    if module.alibi:  # the paper's slopes for a power of 2 heads: 2^(-8h/H)
        slopes = 2.0 ** (-8 * np.arange(1, H + 1) / H)
        s = s - slopes[:, None, None] * np.abs(np.arange(T)[:, None] - np.arange(T)[None, :])
    if module.relative_bias:  # T5's 32 buckets of j - i, bidirectional, written out here
        table, n = w["rel_bias.weight"], np.arange(T)[None, :] - np.arange(T)[:, None]
        far = np.minimum(8 + (np.log(np.maximum(np.abs(n), 1) / 8) / np.log(16) * 8).astype(int), 15)
        s = s + table[np.where(n > 0, 16, 0) + np.where(np.abs(n) < 8, np.abs(n), far)].transpose(2, 0, 1)
    if module.softcap is not None:
        s = module.softcap * np.tanh(s / module.softcap)
    if keep is not None:
        s = np.where(keep, s, -np.inf)
    e = np.exp(s)
    total = e.sum(-1, keepdims=True) + (0 if module.sinks is None else np.exp(w["sink"])[:, None, None])
    weights = e / total
    out = lin("W_o", (weights @ V).transpose(1, 0, 2).reshape(T, H * d))
    return out, weights


def differential_by_hand(module, x: np.ndarray, keep: np.ndarray | None):
    """The DIFF Transformer's equations in NumPy, from the module's weights: (output, weights)."""
    w = {k: v.detach().double().numpy() for k, v in module.state_dict().items()}
    T, H, G, d = len(x), module.heads, module.kv_heads, module.d_k
    heads = lambda name, n: (x @ w[f"{name}.weight"].T + w.get(f"{name}.bias", 0)).reshape(T, n, d).transpose(1, 0, 2)
    Q, K, V = heads("W_q", H), heads("W_k", G).repeat(H // G, 0), heads("W_v", G).repeat(H // G, 0)
    maps = []
    for part in (slice(0, d // 2), slice(d // 2, d)):
        s = Q[..., part] @ K[..., part].transpose(0, 2, 1) / math.sqrt(d // 2)
        e = np.exp(np.where(keep, s, -np.inf) if keep is not None else s)
        maps.append(e / e.sum(-1, keepdims=True))
    lam = math.exp(w["lambda_q1"] @ w["lambda_k1"]) - math.exp(w["lambda_q2"] @ w["lambda_k2"]) + 0.2
    weights = maps[0] - lam * maps[1]
    o = weights @ V
    o = 0.8 * o / np.sqrt((o ** 2).mean(-1, keepdims=True) + 1e-5)
    return o.transpose(1, 0, 2).reshape(T, H * d) @ w["W_o.weight"].T + w["W_o.bias"], weights


@pytest.mark.parametrize("kv_heads, causal, qk_norm", [(None, False, False), (2, True, True)])
def test_differential_attention_is_the_papers_equations(kv_heads, causal, qk_norm):
    torch.manual_seed(5)
    m = MultiHeadAttention(24, 4, kv_heads, diff=True, qk_norm=qk_norm).double()
    x = torch.randn(1, 7, 24, dtype=torch.float64)
    keep = np.tril(np.ones((7, 7), bool)) if causal else None
    out, weights = m(x, mask=None if keep is None else torch.from_numpy(keep))
    if qk_norm:  # the by-hand version has no QK-norm: check that the switch changes the numbers, then stop
        assert not np.allclose(out[0].detach().numpy(), differential_by_hand(m, x[0].numpy(), keep)[0])
        return
    ref_out, ref_w = differential_by_hand(m, x[0].numpy(), keep)
    np.testing.assert_allclose(out[0].detach().numpy(), ref_out, atol=1e-10)
    np.testing.assert_allclose(weights[0].detach().numpy(), ref_w, atol=1e-12)
    lam = float(m.lam().detach())
    np.testing.assert_allclose(weights[0].detach().numpy().sum(-1), 1 - lam, atol=1e-12)  # rows: 1 - λ


VARIANTS = [{"qk_norm": True}, {"softcap": 0.7}, {"sinks": "learned"}, {"sinks": "zero"}, {"alibi": True}, {"rope_dims": 4},
            {"relative_bias": True},
            {"qk_norm": True, "softcap": 1.5, "sinks": "learned", "alibi": True}]


@pytest.mark.parametrize("options", VARIANTS)
@pytest.mark.parametrize("rope_on, kv_heads, causal", [(False, None, False), (True, 2, True)])
def test_each_switch_is_the_numpy_written_here(options, rope_on, kv_heads, causal):
    torch.manual_seed(3)
    m = MultiHeadAttention(24, 4, kv_heads, rope=rope_on, **options).double()
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)  # gains other than 1, so the test sees them
    x = torch.randn(1, 7, 24, dtype=torch.float64) * 3
    keep = np.tril(np.ones((7, 7), bool)) if causal else None
    out, weights = m(x, mask=None if keep is None else torch.from_numpy(keep))
    ref_out, ref_w = by_hand(m, x[0].numpy(), keep)
    np.testing.assert_allclose(out[0].detach().numpy(), ref_out, atol=1e-10)
    np.testing.assert_allclose(weights[0].detach().numpy(), ref_w, atol=1e-12)


@pytest.mark.parametrize("name", ["qwen3", "gemma2", "gpt-oss", "bloom", "diffllama", "phi"])
def test_the_switches_give_transformers_numbers(name):
    """Qwen3's q_norm/k_norm, Gemma 2's attn_logit_softcapping, gpt-oss's sinks, BLOOM's ALiBi and
    Phi's partial_rotary_factor (half of each head's dims turn),
    each the class transformers ships, on the same weights and input (causal; RoPE from its own
    rotary class, BLOOM's ALiBi from its own build_alibi_tensor)."""
    f, case = FIXTURE, FIXTURE[name]
    options = {"kv_heads": f["kv_heads"], "rope": True, "rope_base": f["rope_base"], **case["module_options"]}
    m = MultiHeadAttention(f["d_model"], f["heads"], **options).double()
    m.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in case["weights"].items()})
    T = f["tokens"]
    with torch.no_grad():
        out, weights = m(torch.tensor(case["input"], dtype=torch.float64)[None],
                         mask=torch.ones(T, T, dtype=torch.bool).tril())
    np.testing.assert_allclose(out[0].numpy(), case["output"], atol=1e-5)
    if "attention" in case:  # DiffLlama returns its first map only
        np.testing.assert_allclose(weights[0].numpy(), case["attention"], atol=1e-5)
    if name == "gpt-oss":  # first principles: a sink takes a share of every row
        assert (weights.sum(-1) < 1).all()


def test_differential_attention_gives_the_diff_transformers_own_numbers():
    """microsoft/unilm's MultiheadDiffAttn, the paper's own code (its rotary kernel left out, no GQA;
    see the fixture's script), on the same weights and input: its float32 softmax and norm put it
    about 1e-7 off, so 1e-5."""
    f, case = FIXTURE, FIXTURE["unilm-diff"]
    m = MultiHeadAttention(f["d_model"], f["heads"], bias=False, diff=True).double()
    m.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in case["weights"].items()})
    T = f["tokens"]
    with torch.no_grad():
        out, _ = m(torch.tensor(case["input"], dtype=torch.float64)[None], mask=torch.ones(T, T, dtype=torch.bool).tril())
    np.testing.assert_allclose(out[0].numpy(), case["output"], atol=1e-5)


def test_the_relative_bias_gives_t5s_numbers():
    """T5's encoder attention with its relative_attention_bias over 24 tokens (offsets into its
    log-spaced buckets), no mask; T5 leaves q·k unscaled, so its q ran divided by √d_k (the fixture)."""
    f, case = FIXTURE, FIXTURE["t5"]
    m = MultiHeadAttention(f["d_model"], f["heads"], bias=False, relative_bias=True).double()
    m.load_state_dict({k: torch.tensor(v, dtype=torch.float64) for k, v in case["weights"].items()})
    with torch.no_grad():
        out, weights = m(torch.tensor(case["input"], dtype=torch.float64)[None])
    np.testing.assert_allclose(out[0].numpy(), case["output"], atol=1e-10)
    np.testing.assert_allclose(weights[0].numpy(), case["attention"], atol=1e-10)
    x = np.array(case["input"])
    ref_out, ref_w = by_hand(m, x, None)  # and by hand, far buckets included
    np.testing.assert_allclose(weights[0].numpy(), ref_w, atol=1e-12)


def test_first_principles_of_each_switch():
    from mha_trace.core.tracer import trace

    torch.manual_seed(0)
    x = torch.randn(1, 9, 32, dtype=torch.float64) * 50  # scores far past any cap
    last_scores = lambda m: next(s for s in reversed(trace(m, x, keep_values=True).steps)
                                 if s.op in ("mul", "div") and tuple(s.shape[-2:]) == (9, 9)).value
    torch.manual_seed(1)
    assert last_scores(MultiHeadAttention(32, 4).double()).abs().max() > 20  # what is capped
    torch.manual_seed(1)
    assert last_scores(MultiHeadAttention(32, 4, softcap=2.0).double()).abs().max() <= 2.0  # tanh saturates
    # QK-norm with gains of 1: ‖q‖ = ‖k‖ = √d_k, so |q·k|/√d_k ≤ √d_k
    assert last_scores(MultiHeadAttention(32, 4, qk_norm=True).double()).abs().max() <= math.sqrt(8) + 1e-9
    # a sink takes a share of every row; a sink far below every score is no sink
    plain = MultiHeadAttention(32, 4).double()
    off = MultiHeadAttention(32, 4, sinks="zero").double()
    off.load_state_dict(plain.state_dict())
    learned = MultiHeadAttention(32, 4, sinks="learned").double()
    learned.load_state_dict({**plain.state_dict(), "sink": torch.full((4,), -1e4, dtype=torch.float64)})
    y = torch.randn(1, 5, 32, dtype=torch.float64)
    sums = off(y)[1].sum(-1)
    assert (sums < 1).all() and (sums > 0).all()
    torch.testing.assert_close(learned(y)[1], plain(y)[1], atol=1e-12, rtol=0)


@pytest.mark.parametrize("options", VARIANTS)
def test_decoding_with_each_switch_equals_the_full_causal_pass(options):
    torch.manual_seed(1)
    m = MultiHeadAttention(16, 2, rope=True, **options).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    full, _ = m(x, mask=torch.ones(6, 6, dtype=torch.bool).tril())
    cache = KVCache()
    steps = [m(x[:, :3], mask=torch.ones(3, 3, dtype=torch.bool).tril(), cache=cache)[0]]
    steps += [m(x[:, i:i + 1], cache=cache)[0] for i in range(3, 6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-12, rtol=0)


@pytest.mark.parametrize("flags", [("--softcap", "0.8"), ("--sink-logits",), ("--off-by-one",), ("--qk-norm",),
                                   ("--alibi", "--mask", "causal"), ("--alibi", "--softcap", "0.5"),
                                   ("--diff", "--mask", "causal"), ("--diff", "--qk-norm"),
                                   ("--qk-norm", "--softcap", "1", "--sink-logits", "--rope")])
def test_explain_walks_the_weights_heads_shows(cli, flags):
    """The walk's numbers are computed by hand in analyses.walk; heads' come from the module."""
    walk = json.loads(cli("explain", *flags, "--token", "cat", "--format", "json", "--decimals", "12").stdout)
    heads = json.loads(cli("heads", *flags, "--format", "json", "--decimals", "12").stdout)
    for wh, hh in zip(walk["heads"], heads["heads"]):
        weights = [k["weight"] for k in wh["keys"]]
        np.testing.assert_allclose(weights, hh["weights"][1], atol=1e-11)
        if "second" in wh["keys"][0]:  # differential: each map a softmax; the weight is map 1 - λ·map 2
            maps = [[k["second"][f"map_{i}"] for k in wh["keys"]] for i in (1, 2)]
            assert sum(maps[0]) == pytest.approx(1, abs=1e-12) and sum(maps[1]) == pytest.approx(1, abs=1e-12)
            lam = (np.array(maps[0]) - np.array(weights)) / np.where(np.array(maps[1]) > 0, maps[1], 1)
            assert np.ptp([v for v, m2 in zip(lam, maps[1]) if m2 > 0]) < 1e-9  # one λ for every key
        if "sink" in wh:  # the keys' weights and the sink's make one softmax
            assert sum(weights) + wh["sink"]["weight"] == pytest.approx(1, abs=1e-12)
        if "--softcap" in flags:
            c = float(flags[flags.index("--softcap") + 1])
            for k in wh["keys"]:  # ALiBi's bias first, then the cap
                assert k["capped"] == pytest.approx(c * math.tanh((k["scaled"] + k.get("alibi", 0)) / c), abs=1e-12)


def test_explain_shows_the_cap_and_the_sink(cli):
    out = cli("explain", "--softcap", "1", "--off-by-one", "--token", "cat", "--head", "1").stdout
    assert "1·tanh(s/1)" in out and "(sink)" in out and "fixed at 0" in out
    # the chapter's 'The' key: q·k = 2, ÷√2 = 1.4142, tanh(1.4142) = 0.8884
    assert "1.4142       0.8884" in out


def test_shapes_traces_each_switch(cli):
    out = cli("shapes", "--qk-norm", "--softcap", "30", "--sink-logits", "--width", "120").stdout
    for op in ("rms_norm", "tanh", "cat", "softmax"):
        assert f" {op} " in out
    assert "qk-norm softcap=30 sink-logits" in out.splitlines()[0]
    assert "q_norm 64 · k_norm 64 · sink 8" in out
    data = json.loads(cli("shapes", "--softcap", "30", "--format", "json").stdout)
    assert data["config"]["softcap"] == 30.0 and data["config"]["sinks"] is None


@pytest.mark.parametrize("args, says", [
    (("shapes", "--softcap", "2", "--impl", "sdpa"), "--softcap does not go with --impl sdpa"),
    (("shapes", "--off-by-one", "--impl", "tiled"), "--off-by-one does not go with --impl tiled"),
    (("heads", "--sink-logits", "--off-by-one"), "a head has one sink"),
    (("explain", "--softcap", "0"), "--softcap 0.0 must be a number above 0"),
    (("heads", "--model", "minilm", "--qk-norm"), "--qk-norm does not go with --model"),
    (("shapes", "--module", "example:l04", "--softcap", "1"), "your class decides its own"),
    (("shapes", "--diff", "--decode", "2"), "--diff does not go with --decode"),
    (("explain", "--diff", "--softcap", "2"), "--diff does not go with --softcap"),
    (("shapes", "--diff", "--heads", "512"), "d_k = 1 must be a multiple of 2"),
    (("explain", "--diff", "--rope"), "each turned by RoPE in pairs, so d_k = 2 must be a multiple of 4"),
    (("shapes", "--rope-dim", "4"), "--rope-dim sets how many of each head's dims RoPE turns: add --rope"),
    (("heads", "--relative-bias", "--alibi"), "a head has one position bias"),
    (("shapes", "--relative-bias", "--impl", "tiled"), "--relative-bias does not go with --impl tiled"),
    (("explain", "--relative-bias", "--why"), "a position bias, the cap's tanh and the sink's column are not parts"),
    (("shapes", "--diff", "--relative-bias"), "--diff does not go with --relative-bias"),
    (("shapes", "--rope", "--rope-dim", "6", "--d-model", "16", "--heads", "4"), "it must be from 2 to d_k = 4"),
    (("explain", "--config", "chicken-road", "--rope", "--rope-dim", "10"), "--rope-dim: rope_dim=10 turns"),
    (("shapes", "--rope", "--rope-dim", "4", "--diff"), "--rope-dim does not go with --diff"),
    (("explain", "--config", "chicken-road", "--rope", "--rope-dim", "4", "--rope-planes"),
     "--rope-dim does not go with --rope-planes"),
])
def test_refusals_are_one_line(cli, args, says):
    result = cli(*args)
    assert result.exit_code != 0 and says in result.stderr and "Traceback" not in result.stderr


def test_the_api_takes_the_same_switches():
    import mha_trace
    from mha_trace.errors import MhaError

    walk = mha_trace.explain(token="cat", softcap=1.0, sink_logits=True)
    assert walk.heads[0].sink is not None and walk.heads[0].terms[0].capped is not None
    with pytest.raises(MhaError, match="does not go with --impl sdpa"):
        mha_trace.trace_sizes(softcap=2.0, impl="sdpa")


M = "tests/student/scoring_modules.py:"


@pytest.mark.parametrize("cls, flags, diagnosis, line", [
    ("SoftCap", ("--softcap", "2", "--mask", "causal"), None, None),
    ("QKNorm", ("--qk-norm",), None, None),
    ("FunctionalNorm", ("--qk-norm", "--mask", "causal"), None, None),
    ("Sinks", ("--sink-logits", "--mask", "causal"), None, None),
    ("OffByOne", ("--off-by-one", "--mask", "causal"), None, None),
    ("CapAfterMask", ("--softcap", "2", "--mask", "causal"), "soft cap after the mask", 50),
    ("CapWithoutC", ("--softcap", "2"), "soft cap without its c", 55),
    ("CapBeforeScale", ("--softcap", "2"), "soft cap before the scale by √d_k", 61),
    ("NormOverSequence", ("--qk-norm",), "QK-norm over the sequence", 76),
    ("NormQOnly", ("--qk-norm",), "QK-norm on q only", 26),
    ("DefaultEps", ("--qk-norm",), "QK-norm's eps left at F.rms_norm's default", 235),
    ("SinkScaled", ("--sink-logits",), "the sink's logit divided by √d_k too", 100),
    ("Scored", ("--sink-logits",), "the sink never joins the softmax", 38),
    ("Alibi", ("--alibi", "--mask", "causal"), None, None),
    ("AlibiFavoursFar", ("--alibi", "--mask", "causal"), "ALiBi's bias with the wrong sign", 150),
    ("AlibiReversed", ("--alibi",), "ALiBi's slopes in reverse order", 156),
    ("AlibiBeforeScale", ("--alibi",), "ALiBi's bias divided by √d_k too", 162),
    ("Differential", ("--diff", "--mask", "causal"), None, None),
    ("DiffRawLambda", ("--diff",), "λ not re-parametrised", 201),
    ("DiffNoNorm", ("--diff",), "each head's output not normed", 206),
    ("DiffScaledByDk", ("--diff",), "each map scaled by √d_k, not √(d_k / 2)", 211),
    ("DiffSecondAdded", ("--diff", "--mask", "causal"), "the second map added, not taken away", 223),
    ("DiffNotScaled", ("--diff",), "each head's output not scaled by 1 - λ_init", 230),
    ("CapAfterSoftmax", ("--softcap", "2"), "soft cap applied after the softmax", 118),
    ("CapWithoutOuterC", ("--softcap", "2"), "soft cap without the c outside", 123),
    ("NormWholeProjection", ("--qk-norm",), "QK-norm over the whole projection", 131),
    ("PartialRope", ("--rope", "--rope-dim", "4", "--mask", "causal"), None, None),
    ("T5Bias", ("--relative-bias", "--mask", "causal"), None, None),
    ("T5BiasReversed", ("--relative-bias",), "T5's bias bucketed by i - j", 289),
    ("T5BiasScaled", ("--relative-bias",), "T5's bias divided by √d_k too", 301),
    ("PartialRopeLastDims", ("--rope", "--rope-dim", "4"), "partial RoPE on the last R dims", 257),
    ("PartialRopeFrequencies", ("--rope", "--rope-dim", "4"), "partial RoPE's frequencies over d_k", 247),
    ("PartialRopeWhole", ("--rope", "--rope-dim", "4"), "every dim of each head turned, not the first R", 247),
])
def test_verify_grades_a_students_variant_under_its_flag(cli, cls, flags, diagnosis, line):
    """Right when right (the student's own sink logits and norm gains are taken into the lecture's
    module); Wrong at its line, the mistake named, when one step of the variant is done wrong."""
    result = cli("verify", "--module", M + cls, *flags, "--format", "json")
    data = json.loads(result.stdout)
    assert data["passed"] is (diagnosis is None), data
    if diagnosis:
        assert result.exit_code == 1 and data["diagnosis"].startswith(diagnosis)
        assert data["first_wrong_step"]["line"] == line


def test_the_variants_zoo_holds_every_mistake_of_the_variants():
    from mha_trace.analyses.mistakes import DIFF_MISTAKES, PARTIAL_MISTAKES, SCORING_MISTAKES

    graded = test_verify_grades_a_students_variant_under_its_flag.pytestmark[0].args[1]
    named = {d for _, _, d, _ in graded if d}
    missing = [m.name for m in SCORING_MISTAKES + DIFF_MISTAKES + PARTIAL_MISTAKES
               if not any(m.name.startswith(d) for d in named)]
    assert len(SCORING_MISTAKES) >= 13 and missing == []


@pytest.mark.parametrize("cls, flag, given", [
    ("Sinks", "--sink-logits checks it", ()), ("SoftCap", "--softcap C checks it", ()),
    ("QKNorm", "--qk-norm checks it", ()), ("Differential", "--diff checks it", ()),
    ("PartialRope", "--rope --rope-dim 4 checks it", ("--rope",)), ("T5Bias", "--relative-bias T5's", ())])
def test_without_its_flag_a_variant_is_named_with_the_flag_that_checks_it(cli, cls, flag, given):
    data = json.loads(cli("verify", "--module", M + cls, *given, "--format", "json").stdout)
    assert not data["passed"] and data["diagnosis"] is None and flag in data["variant"]


def test_the_api_grades_the_same():
    import mha_trace

    assert mha_trace.verify(M + "Sinks", sink_logits=True).passed
    assert mha_trace.verify(M + "CapWithoutC", softcap=2.0).diagnosis.startswith("soft cap without its c")


def test_differential_walk_with_rope_is_the_modules(cli):
    """Each half of q and k turns as a head of its own: the walk's weights equal the module's."""
    args = ("--diff", "--rope", "--config", "chicken-road", "--mask", "causal", "--format", "json", "--decimals", "12")
    walk = json.loads(cli("explain", *args, "--token", "it").stdout)
    heads = json.loads(cli("heads", *args).stdout)
    for wh, hh in zip(walk["heads"], heads["heads"]):
        np.testing.assert_allclose([k["weight"] for k in wh["keys"]], hh["weights"][7], atol=1e-11)


def test_partial_rope_walk_is_phis_by_hand(cli):
    """explain --rope --rope-dim 4: each head's weights for 'it' and the token's output equal attention
    written out here on the module's own weights, its first 4 dims turned and the other 4 passed."""
    from mha_trace.runs.resolve import RunOptions, resolve

    args = ("--config", "chicken-road", "--rope", "--rope-dim", "4", "--mask", "causal")
    walk = json.loads(cli("explain", *args, "--token", "it", "--format", "json").stdout)
    run = resolve(RunOptions(config="chicken-road", rope=True, rope_dim=4, mask="causal"))
    x = run.x[0].numpy()
    out, weights = by_hand(run.module, x, np.tril(np.ones((len(x), len(x)), bool)))
    for h, head in enumerate(walk["heads"]):
        np.testing.assert_allclose([k["weight"] for k in head["keys"]], weights[h, 7], atol=1e-12)
    np.testing.assert_allclose(walk["output"], out[7], atol=1e-12)
    assert walk["config"]["rope_dim"] == 4
    whole = json.loads(cli("explain", *args[:3], "--mask", "causal", "--token", "it", "--format", "json").stdout)
    assert not np.allclose(whole["output"], walk["output"])  # the 4 dims passed through change the numbers
    assert "RoPE base 10000 on 4 of 8 dims" in cli("heads", *args, "--head", "1").stdout


def test_the_walk_adds_t5s_bias_by_hand(cli):
    """explain --relative-bias: the '+ T5 bias' column is the bias by hand (each head's learned number
    for the bucket of j - i), and each weight and the token's output equal attention by hand."""
    from mha_trace.runs.resolve import RunOptions, resolve

    walk = json.loads(cli("explain", "--config", "chicken-road", "--relative-bias", "--token", "it",
                          "--format", "json").stdout)
    run = resolve(RunOptions(config="chicken-road", relative_bias=True))
    x, table = run.x[0].numpy(), run.module.rel_bias.weight.detach().numpy()
    out, weights = by_hand(run.module, x, None)
    for h, head in enumerate(walk["heads"]):
        buckets = [16 * (j > 7) + abs(j - 7) for j in range(len(head["keys"]))]  # offsets below 8: a bucket each
        np.testing.assert_allclose([k["relative_bias"] for k in head["keys"]], table[buckets, h], atol=1e-12)
        np.testing.assert_allclose([k["weight"] for k in head["keys"]], weights[h, 7], atol=1e-12)
    np.testing.assert_allclose(walk["output"], out[7], atol=1e-12)
    text = cli("explain", "--config", "chicken-road", "--relative-bias", "--token", "it", "--head", "1").stdout
    assert "+ T5 bias" in text and "T5's relative bias" in text
