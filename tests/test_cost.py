"""`cost`: every figure derived independently, and never a torch import."""

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mha_trace.core.attention import MultiHeadAttention
from mha_trace.core.costs import Dims, cost_rows, flops
from mha_trace.core.presets import load_preset, preset_names
from mha_trace.core.windows import band, layer_kinds

PRESETS = [n for n in preset_names()  # heads that cache K, V, each d_model / heads wide (the lecture's)
           if load_preset(n).get("attention") != "mla" and "head_dim" not in load_preset(n)]


def rows_by_item(rows):
    return {(r.section, r.item): r for r in rows}


@pytest.mark.parametrize("name", PRESETS)
@pytest.mark.slow
def test_parameters_match_a_module_built_on_meta(name):
    p = load_preset(name)
    with torch.device("meta"):
        m = MultiHeadAttention(p["d_model"], p["heads"], p["kv_heads"], bias=p["bias"])
    d = Dims(1, p["seq"], p["d_model"], p["heads"], p["kv_heads"], bias=p["bias"])
    rows = rows_by_item(cost_rows(d, p["layers"]))
    assert rows[("parameters", "attention total")].per_layer == sum(x.numel() for x in m.parameters())
    for layer in ("W_q", "W_k", "W_v", "W_o"):
        assert rows[("parameters", layer)].per_layer == sum(x.numel() for x in getattr(m, layer).parameters())
    assert rows[("parameters", "attention total")].total == p["layers"] * sum(x.numel() for x in m.parameters())


@pytest.mark.parametrize("heads,kv_heads", [(8, 8), (8, 2)])
def test_matmul_flops_match_torch_flop_counter(heads, kv_heads):
    """torch's own counter sees the projections and the two attention matmuls (2 per MAC)."""
    d = Dims(2, 16, 64, heads, kv_heads, bias=False)
    with torch.device("meta"):
        m = MultiHeadAttention(64, heads, kv_heads, bias=False)
        x = torch.empty(2, 16, 64)
    counter = FlopCounterMode(display=False)
    with counter:
        m(x)
    rows = rows_by_item(cost_rows(d, 1))
    matmuls = sum(rows[("flops", item)].per_layer for item in
                  ("Q projection", "K, V projections", "scores QKᵀ", "weights · V", "output projection"))
    assert counter.get_total_flops() == matmuls


def test_gpt3_kv_cache_and_score_memory_from_first_principles():
    d = Dims(1, 2048, 12288, 96, 96, "float16")
    rows = rows_by_item(cost_rows(d, 96))
    # K and V, 96 heads × 128 dims, 2 bytes, 96 layers, 2048 tokens
    kv = 2 * 96 * 128 * 2 * 96 * 2048
    assert rows[("memory", "KV cache, batch × seq × layers")].total == kv == 9_663_676_416
    assert kv > 3 * 3e9  # the chapter's "~3 GB in fp16" is off by more than 3×
    long = rows_by_item(cost_rows(Dims(1, 8192, 12288, 96, 96, "float16"), 96))
    # the chapter: "for H = 96 and N = 8192 ... from ~6 GB": one layer's fp16 scores are 12.9 GB
    assert long[("memory", "scores, materialised")].total == 96 * 8192 * 8192 * 2 == 12_884_901_888
    assert long[("memory", "scores, tiled (FlashAttention-2)")].total == 96 * 8192 * 4


def test_gqa_kv_cache_saving():
    rows = rows_by_item(cost_rows(Dims(8, 4096, 8192, 64, 8, "float16", bias=False), 80))
    full = 2 * 64 * 128 * 2 * 80 * 8 * 4096
    kept = rows[("memory", "KV cache, batch × seq × layers")].total
    assert kept * 8 == full
    assert rows[("memory", "KV cache saved vs 64 K/V heads")].total == full - kept


def test_cli_preset_with_overrides_and_formulas(cli):
    data = json.loads(cli("cost", "--preset", "llama2-70b", "--seq", "100", "--format", "json").stdout)
    c = data["config"]
    assert (c["d_model"], c["heads"], c["kv_heads"], c["layers"], c["seq"], c["batch"]) == (8192, 64, 8, 80, 100, 1)
    assert data["schema_version"] == 2 and c["source"].startswith("Touvron")
    out = cli("cost", "--preset", "gpt3-175b", "--dtype", "float16", "--formulas",
              "--width", "200").stdout
    assert "2·G·d_k·s·L·B·T = 2·96·128·2·96·1·2048" in out
    assert "9,663,676,416" in out and "9.66 GB" in out and "9.0 GiB" in out


def test_cli_markdown(cli):
    out = cli("cost", "--format", "markdown").stdout
    assert "| W_q | 262,656 | 262,656 |" in out


def test_cost_golden(cli, golden):
    golden("cost_gpt3.txt", cli("cost", "--preset", "gpt3-175b", "--dtype", "float16").stdout)


@pytest.mark.slow
def test_cost_never_imports_torch():
    code = ("import sys; from typer.testing import CliRunner; from mha_trace.cli import app; "
            "r = CliRunner().invoke(app, ['cost', '--preset', 'gpt3-175b', '--formulas']); "
            "assert r.exit_code == 0, r.output; r = CliRunner().invoke(app, ['configs']); "
            "assert r.exit_code == 0; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.parametrize("args,message", [
    (("--preset", "gpt5"), "--preset 'gpt5' is not bundled (presets: bert-base, deepseek-v2, deepseek-v3, "
                           "gemma-2-9b, gpt-oss-20b, gpt2-medium, gpt2-small, gpt3-175b, "
                           "llama2-70b, llama2-7b, mistral-7b, smollm2-135m, whisper-tiny-en)"),
    (("--d-model", "100", "--heads", "7"),
     "--heads: d_model=100 is not divisible by heads=7 (valid head counts: 1, 2, 4, 5, 10, 20, 25, 50, 100)"),
    (("--layers", "0"), "--layers: layers=0 must be a positive integer (at least 1)"),
    (("--seq", "-1"), "--seq: seq=-1 must be a positive integer (at least 1)"),
    (("--preset", "mistral-7b", "--heads", "4"),
     "--kv-heads: heads=4 is not divisible by kv_heads=8 (valid kv-head counts: 1, 2, 4)"),
])
@pytest.mark.slow
def test_cost_bad_input(cli, args, message):
    result = cli("cost", *args)
    assert result.exit_code == 2
    assert result.stderr == f"Error: {message}\n"


@pytest.mark.parametrize("T,W", [(8192, 4096), (10, 3), (10, 10), (10, 50), (1, 1), (7, 1)])
def test_a_sliding_window_keeps_its_band_of_scores_counted_by_hand(T, W):
    """Query i sees min(i + 1, W) keys: the band the window keeps, counted against the mask
    itself; W ≥ T is the causal triangle."""
    from mha_trace.core.masks import allowed

    assert band(T, W) == sum(min(i + 1, W) for i in range(T))
    if T <= 50:
        assert band(T, W) == int(np.asarray(allowed(T, window=W)).sum())
    if W >= T:
        assert band(T, W) == T * (T + 1) // 2


def test_mistral_sliding_window_scores_and_flops_count_the_band(cli):
    data = json.loads(cli("cost", "--preset", "mistral-7b", "--dtype", "float16", "--format", "json").stdout)
    rows = {r["item"]: r for r in data["rows"]}
    assert rows["scores, sliding window 4096 (band only)"]["per_layer"] == 1_610_743_808  # not 2,147,483,648
    band = 4096 * 4097 // 2 + (8192 - 4096) * 4096
    assert rows["scores QKᵀ"]["per_layer"] == 2 * 32 * band * 128
    assert rows["softmax"]["per_layer"] == 5 * 32 * band
    assert rows["weights · V"]["per_layer"] == 2 * 32 * band * 128


def test_a_decoders_cross_attention_is_counted_as_whispers_is_built(cli):
    """`cost --preset whisper-tiny-en`: beside each decoder layer's self-attention a second one,
    T text positions against S = 1,500 audio frames; its parameters are the loaded model's own
    (counted from its modules), its scores T×S, its K/V computed once: 2 × 4 layers × 1,500
    frames × 384 values × 4 bytes."""
    import json

    from mha_trace.models.whisper import load_whisper

    data = json.loads(cli("cost", "--preset", "whisper-tiny-en", "--format", "json").stdout)
    rows = {r["item"]: r for r in data["rows"] if r["section"] != "parameters"}
    params = {r["item"]: r for r in data["rows"] if r["section"] == "parameters"}
    decoder = load_whisper().decoder
    count = lambda attention: sum(p.numel() for p in attention.parameters())
    assert params["cross-attention total"]["total"] == sum(count(b.cross) for b in decoder.blocks)
    assert params["attention total"]["total"] == sum(count(b.attention) for b in decoder.blocks)
    assert params["self + cross total"]["total"] == 2 * params["attention total"]["total"]
    assert rows["cross K/V (static cache), all layers"]["total"] == 2 * 4 * 1500 * 384 * 4
    assert rows["cross scores QKᵀ"]["per_layer"] == 2 * 6 * 448 * 1500 * 64
    assert rows["cross scores, materialised"]["total"] == 6 * 448 * 1500 * 4
    assert data["config"]["cross_keys"] == 1500
    encoder = json.loads(cli("cost", "--preset", "whisper-tiny-en", "--seq", "1500", "--cross-keys", "0",
                             "--format", "json").stdout)
    assert not any(r["item"].startswith("cross") for r in encoder["rows"])
    refused = cli("cost", "--cross-keys", "-3")
    assert refused.exit_code == 2 and "cross_keys" in refused.stderr.replace("-", "_")


def _deepseek_attention(D, H, q_rank, kv_rank, dh, dR, dv):
    """DeepSeek-V2's attention layers as transformers' DeepseekV2Attention builds them from a config."""
    nn = torch.nn
    return nn.ModuleDict({"q_a_proj": nn.Linear(D, q_rank, bias=False), "q_a_layernorm": nn.RMSNorm(q_rank),
                          "q_b_proj": nn.Linear(q_rank, H * (dh + dR), bias=False),
                          "kv_a_proj_with_mqa": nn.Linear(D, kv_rank + dR, bias=False),
                          "kv_a_layernorm": nn.RMSNorm(kv_rank),
                          "kv_b_proj": nn.Linear(kv_rank, H * (dh + dv), bias=False),
                          "o_proj": nn.Linear(H * dv, D, bias=False)})


@pytest.mark.parametrize("name,elements", [("deepseek-v2", 34_560), ("deepseek-v3", 35_136)])
def test_latent_attention_presets_match_their_layers_and_the_papers_cache(name, elements):
    """Parameters: the layers DeepSeek's configs build, counted by torch on meta. The cache: DeepSeek-V2's
    Table 1, (d_c + d_R)·l elements a token, 4.5·d_h·l with d_c = 4·d_h and d_R = d_h / 2."""
    from mha_trace.core.costs import cost_report

    p = load_preset(name)
    with torch.device("meta"):
        m = _deepseek_attention(p["d_model"], p["heads"], p["q_lora_rank"], p["kv_lora_rank"],
                                p["qk_nope_head_dim"], p["qk_rope_head_dim"], p["v_head_dim"])
    report = cost_report(name, dtype="bfloat16")
    rows = rows_by_item(report.rows)
    assert rows[("parameters", "attention total")].per_layer == sum(x.numel() for x in m.parameters())
    per_token = rows[("memory", "KV cache per token, all layers")].total
    assert per_token == elements * 2 and elements == 4.5 * p["qk_nope_head_dim"] * p["layers"]
    assert report.data()["config"]["latent"]["kv_cache_elements_per_token"] == elements


def test_latent_attention_flops_match_torch_flop_counter():
    """The naive form's products (the projections, the scores and weights · V) as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode

    from mha_trace.core.latent import Latent

    B, T, D, H, q_rank, c, dh, dR, dv = 2, 8, 64, 4, 32, 16, 16, 8, 16
    d = Dims(B, T, D, H, H, bias=False, latent=Latent(c, dR, dh, dv, q_rank))
    with torch.device("meta"):
        m, x = _deepseek_attention(D, H, q_rank, c, dh, dR, dv), torch.randn(B, T, D)
    with FlopCounterMode(display=False) as counter:
        q = m["q_b_proj"](m["q_a_layernorm"](m["q_a_proj"](x))).view(B, T, H, dh + dR).transpose(1, 2)
        latent, k_rope = m["kv_a_proj_with_mqa"](x).split([c, dR], dim=-1)
        k_nope, v = m["kv_b_proj"](m["kv_a_layernorm"](latent)).view(B, T, H, dh + dv).transpose(1, 2).split([dh, dv], -1)
        k = torch.cat([k_nope, k_rope[:, None].expand(B, H, T, dR)], dim=-1)
        w = torch.softmax(q @ k.transpose(-2, -1) / (dh + dR) ** 0.5, dim=-1)
        m["o_proj"]((w @ v).transpose(1, 2).reshape(B, T, H * dv))
    rows = rows_by_item(cost_rows(d, 1))
    products = ("Q down to d_c'", "Q up (d_h + d_R a head)", "down to c and the RoPE key", "K, V up from c",
                "scores QKᵀ (d_h + d_R a head)", "weights · V", "output projection")
    assert counter.get_total_flops() == sum(rows[("flops", item)].per_layer for item in products)


def test_latent_attention_refuses_what_counts_per_head_caches(cli):
    for args in (("--preset", "deepseek-v2", "--io"), ("--preset", "deepseek-v2", "--window", "64"),
                 ("--latent", "16", "--io")):
        result = cli("cost", *args)
        assert result.exit_code == 2 and "caches one latent a token" in result.stderr
    result = cli("cost", "--rope-dim", "8")
    assert result.exit_code == 2 and "--rope-dim sizes MLA's decoupled RoPE key: add --latent" in result.stderr


def test_cost_latent_counts_the_lecture_mla_module(cli):
    """cost --latent at the module's sizes: its parameters are LatentAttention's own (torch's count),
    its matmul FLOPs torch's counter's on the naive form (as it trains), its cache d_c + d_R a token."""
    from torch.utils.flop_counter import FlopCounterMode

    from mha_trace.core.latent_attention import LatentAttention

    data = json.loads(cli("cost", "--latent", "16", "--rope-dim", "4", "--d-model", "64", "--heads", "4",
                          "--seq", "8", "--format", "json").stdout)
    with torch.device("meta"):
        m, x = LatentAttention(64, 4, 16, 4), torch.empty(2, 8, 64)
    counter = FlopCounterMode(display=False)
    with counter:
        m(x)
    rows = {(r["section"], r["item"]): r["per_layer"] for r in data["rows"]}
    assert rows[("parameters", "attention total")] == sum(p.numel() for p in m.parameters())
    products = ("Q up (d_h + d_R a head)", "down to c and the RoPE key", "K, V up from c",
                "scores QKᵀ (d_h + d_R a head)", "weights · V", "output projection")
    assert counter.get_total_flops() == sum(rows[("flops", item)] for item in products)
    assert data["config"]["latent"]["kv_cache_elements_per_token"] == 16 + 4


MODERN = json.loads((Path(__file__).parent / "fixtures" / "modern_cost_reference.json").read_text())


@pytest.mark.parametrize("name", ["gpt-oss-20b", "gemma-2-9b"])
def test_a_hybrid_presets_layers_and_cache_match_what_transformers_builds(name):
    """gpt-oss-20b and Gemma 2 9B: one attention layer's parameters equal the module transformers
    builds from the published dimensions (q, k, v, o, their biases and gpt-oss's sinks); the local
    and global layers are the config's sliding and full layers; the whole KV cache is each layer's
    kept tokens summed over the config's own layer list."""
    ref, p = MODERN[name], load_preset(name)
    d = Dims(1, p["seq"], p["d_model"], p["heads"], p["kv_heads"], bias=p["bias"], window=p["window"],
             head_dim=p["head_dim"], local_global=tuple(p["local_global"]),
             sink_logits=p.get("sink_logits", False))
    rows = rows_by_item(cost_rows(d, p["layers"]))
    assert rows[("parameters", "attention total")].per_layer == ref["attention_parameters"]
    assert ("parameters", "sink logits") in rows if p.get("sink_logits") else True
    kinds = layer_kinds(d, p["layers"])
    assert kinds == (ref["layer_types"].count("sliding_attention"), ref["layer_types"].count("full_attention"))
    assert p["window"] == ref["sliding_window"] and d.d_k == ref["head_dim"]
    kept = sum(min(p["seq"], p["window"]) if kind == "sliding_attention" else p["seq"]
               for kind in ref["layer_types"])
    whole = next(r for (section, item), r in rows.items() if item.startswith("KV cache ("))
    assert whole.total == 2 * ref["kv_heads"] * ref["head_dim"] * 4 * kept  # float32: 4 bytes


@pytest.mark.parametrize("T,W,S", [(10, 4, 2), (10, 3, 5), (5, 8, 2), (50, 7, 3), (12, 12, 4), (8192, 4096, 4)])
def test_sinks_keep_their_scores_counted_against_the_mask(T, W, S):
    """StreamingLLM's S sinks beside a window of W: each query's keys, counted from a mask built
    here (the window's band, or the first S tokens, causal), equal the band's formula."""

    if T <= 64:
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        seen = (j <= i) & ((j > i - W) | (j < S))
        assert band(T, W, S) == int(seen.sum())
    assert band(T, W, S) == sum(min(n + 1, W) + min(S, max(0, n + 1 - W)) for n in range(T))


def test_a_local_global_pattern_splits_the_layers_and_the_flops(cli):
    """--local-global 5:1 over 12 layers: 10 local, 2 global (the sixth and the twelfth); the
    FLOPs' total is the global layers' full stages plus the local layers' band; sink logits are one
    parameter a head; and the options that need a window say so."""
    d = Dims(1, 64, 64, 4, 2, bias=False, window=8, local_global=(5, 1), sink_logits=True)
    assert layer_kinds(d, 12) == (10, 2) and layer_kinds(d, 13) == (11, 2) and layer_kinds(d, 5) == (5, 0)
    rows = rows_by_item(cost_rows(d, 12))
    full, local = flops(replace(d, window=None)), flops(d)
    assert rows[("flops", "attention total")].total == 2 * full + 10 * local
    assert rows[("parameters", "sink logits")].per_layer == 4
    shown = json.loads(cli("cost", "--window", "8", "--local-global", "5:1", "--layers", "12", "--seq", "64",
                           "--format", "json").stdout)
    assert any("10 local layers × 8, 2 global × 64" in r["item"] for r in shown["rows"])
    assert shown["config"]["local_global"] == [5, 1] and shown["config"]["sink_logits"] is False
    for args, message in ((["--sinks", "2"], "--sinks describes the layers a sliding window has: add --window W"),
                          (["--window", "4", "--local-global", "x"], "is not LOCAL:GLOBAL layers a cycle")):
        refused = cli("cost", *args)
        assert refused.exit_code == 2 and message in refused.stderr


@pytest.mark.parametrize("options", [{"qk_norm": True}, {"diff": True}, {"qk_norm": True, "diff": True, "kv_heads": 2},
                                     {"alibi": True, "softcap": 30.0}, {"relative_bias": True}, {"sinks": "zero"}])
def test_the_scores_variants_cost_what_the_module_holds_and_runs(options):
    """Their parameters are the module's own (torch's count); the matmuls still torch's counter's
    (differential attention's two half-width maps cost one full map's); the rest counted by hand."""
    from mha_trace.core.scoring import Scoring

    kv = options.pop("kv_heads", 8)
    scoring = Scoring(qk_norm=options.get("qk_norm", False), softcap=options.get("softcap"),
                      alibi=options.get("alibi", False), diff=options.get("diff", False),
                      relative_bias=options.get("relative_bias", False), sinks=options.get("sinks"))
    d = Dims(2, 16, 64, 8, kv, bias=False, scoring=scoring)
    with torch.device("meta"):
        m = MultiHeadAttention(64, 8, kv, bias=False, **options)
        x = torch.empty(2, 16, 64)
    counter = FlopCounterMode(display=False)
    with counter:
        m(x)
    rows = rows_by_item(cost_rows(d, 1))
    assert rows[("parameters", "attention total")].per_layer == sum(p.numel() for p in m.parameters())
    from mha_trace.core.costs import cost_report

    switches = {k: v for k, v in options.items() if k != "sinks"} | {"off_by_one": options.get("sinks") == "zero"}
    assert cost_report(**switches).data()["config"]["scores"] == scoring.flags()  # what the JSON says was counted
    matmuls = sum(rows[("flops", item)].per_layer for item in
                  ("Q projection", "K, V projections", "scores QKᵀ", "weights · V", "output projection"))
    assert counter.get_total_flops() == matmuls
    B, T, H, k = 2, 16, 8, 8
    by_hand = {"QK-norm (RMSNorm of q and k)": 4 * B * T * (H + kv) * k, "ALiBi's bias added": B * H * T * T,
               "T5's bias added": B * H * T * T, "softmax's 0 logit (off-by-one)": 5 * B * H * T,
               "soft cap c·tanh(s / c)": 3 * B * H * T * T, "second map: its scale and softmax": 6 * B * H * T * T,
               "map 1 − λ·map 2": 2 * B * H * T * T, "head norm and × (1 − λ_init)": 5 * B * T * H * k}
    added = {item: row.per_layer for (section, item), row in rows.items() if section == "flops" and item in by_hand}
    assert added and all(added[item] == by_hand[item] for item in added)
    maps = 2 if scoring.diff else 1
    assert rows[("memory", "scores, materialised" + " (two maps)" * (maps == 2))].per_layer == maps * B * H * T * T * 4


def test_cost_takes_the_variants_flags(cli):
    data = json.loads(cli("cost", "--qk-norm", "--diff", "--format", "json").stdout)
    items = {r["item"] for r in data["rows"]}
    assert {"q_norm, k_norm (gains)", "λ_q1, λ_k1, λ_q2, λ_k2", "map 1 − λ·map 2"} <= items
    refused = cli("cost", "--diff", "--window", "4")
    assert refused.exit_code != 0 and "--diff does not go with --window" in refused.stderr


@pytest.mark.parametrize("rope_dim", [None, 4])
def test_rope_costs_what_the_module_turns(cli, rope_dim):
    """RoPE's FLOPs equal the products and sums its line runs in the module, traced on the meta
    device (x·cos + rotate_half(x)·sin over every element of q and k it turns: each head's d_k, or
    with --rope-dim the first R, Phi's partial RoPE); it adds no parameter."""
    from mha_trace.core.tracer import trace

    B, T, D, H, G = 2, 8, 64, 4, 2
    with torch.device("meta"):
        m, x = MultiHeadAttention(D, H, G, rope=True, rope_dims=rope_dim), torch.empty(B, T, D)
    steps = trace(m, x).steps
    turned = sum(math.prod(s.shape) for s in steps if s.op in ("mul", "add") and "rotate_half(x) * sin" in s.source)
    extra = ("--rope-dim", str(rope_dim)) if rope_dim else ()
    data = json.loads(cli("cost", "--rope", *extra, "--batch", str(B), "--seq", str(T), "--d-model", str(D),
                          "--heads", str(H), "--kv-heads", str(G), "--format", "json").stdout)
    rows = {(r["section"], r["item"]): r["per_layer"] for r in data["rows"]}
    assert rows[("flops", "RoPE (q and k turned)")] == turned == 3 * B * T * (H + G) * (rope_dim or D // H)
    assert rows[("parameters", "attention total")] == sum(p.numel() for p in m.parameters())
    assert data["config"]["rope_dim"] == rope_dim
