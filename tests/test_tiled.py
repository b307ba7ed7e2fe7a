"""The tiled forward (FlashAttention-2's loop, `--impl tiled`): exact against PyTorch's own
attention and logsumexp in float64, how exact in float32 and float16, and traced tile by tile
without ever forming a T×T tensor."""

import json
import math
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mha_trace.core.attention import MultiHeadAttention, tiled_attention


def masked_reference(Q, K, V, mask):
    """SDPA, with a row that may look at nothing set to 0 (as the explicit path does), and the
    logsumexp of the masked scores by torch.logsumexp."""
    out = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask)
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.size(-1))
    if mask is None:
        return out, torch.logsumexp(scores, -1)
    out = torch.where(mask.any(-1, keepdim=True), out, 0.0)
    return out, torch.logsumexp(scores.masked_fill(~mask, float("-inf")), -1)


@pytest.mark.parametrize("first", range(0, 200, 25))
def test_tiled_equals_sdpa_and_logsumexp_in_float64(first):
    """200 random shapes, masks (none, random with rows that see nothing, causal) and tiles."""
    for trial in range(first, first + 25):
        rng = random.Random(trial)
        torch.manual_seed(trial)
        B, H, T, Tk, d = rng.randint(1, 3), rng.randint(1, 4), rng.randint(1, 17), rng.randint(1, 17), rng.choice([2, 4, 8])
        Q, K, V = (torch.randn(B, H, n, d, dtype=torch.float64) for n in (T, Tk, Tk))
        mask = [None, torch.rand(B, 1, T, Tk) > 0.4, torch.ones(T, Tk, dtype=torch.bool).tril(Tk - T)][trial % 3]
        block_q, block_k = rng.randint(1, T), rng.randint(1, Tk)  # T need not divide by the block
        out, lse = tiled_attention(Q, K, V, mask, block_q, block_k)
        ref_out, ref_lse = masked_reference(Q, K, V, mask)
        assert (out - ref_out).abs().max() <= 1e-6, trial
        assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse))  # a row with every key masked: -inf
        assert (lse - ref_lse).nan_to_num(posinf=0, neginf=0).abs().max() <= 1e-6, trial


@pytest.mark.parametrize("options", [{}, {"kv_heads": 2}, {"rope": True}, {"window": 3},
                                     {"kv_heads": 1, "rope": True, "block_q": 3, "block_k": 2}])
def test_the_tiled_module_equals_the_explicit_one(options):
    blocks = {k: options.pop(k) for k in ("block_q", "block_k") if k in options}
    torch.manual_seed(0)
    explicit = MultiHeadAttention(32, 4, **options).double()
    tiled = MultiHeadAttention(32, 4, **options, impl="tiled", **blocks).double()
    tiled.load_state_dict(explicit.state_dict())
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    causal = torch.ones(7, 7, dtype=torch.bool).tril()
    assert (explicit(x, mask=causal)[0] - tiled(x, mask=causal)[0]).abs().max() <= 1e-12
    assert tiled(x)[1] is None


@pytest.mark.parametrize("dtype,bound", [("float64", 1e-12), ("float32", 1e-5), ("float16", 5e-3)])
def test_compare_impl_shows_how_exact_the_tiled_path_is(cli, dtype, bound):
    """"Bit-identical"? In float64 to 1e-15; in float32 and float16 the sums run in another order."""
    args = ("shapes", "--impl", "tiled", "--compare-impl", "--mask", "causal", "--dtype", dtype)
    data = json.loads(cli(*args, "--format", "json").stdout)["compare_impl"]
    assert 0 <= data["max_abs_diff"] <= bound and data["tiled_bytes"] > 0
    text = " ".join(cli(*args, "--width", "100").stdout.split())
    said = (f"the outputs differ by at most {data['max_abs_diff']:.2e} ({dtype}: the sums run in another order)"
            if data["max_abs_diff"] else "the outputs are bit-identical")
    assert said in text


def test_the_trace_walks_every_tile_with_its_running_max_sum_and_rescale(cli):
    data = json.loads(cli("shapes", "--impl", "tiled", "--seq", "7", "--block-q", "3", "--block-k", "4",
                          "--mask", "causal", "--format", "json").stdout)
    steps = data["steps"]
    tiles = [s["shape"] for s in steps if s["op"] == "matmul" and s["source"].lstrip().startswith("S_ij")]
    # 3 query tiles (3, 3, 1 rows) × 2 key tiles (4, 3 rows): each score tile (B, H, B_r, B_c)
    assert tiles == [[2, 8, q, k] for q in (3, 3, 1) for k in (4, 3)]
    rescales = [s for s in steps if s["op"] == "exp" and "m - m_safe" in s["text"]]
    assert [s["shape"] for s in rescales] == [[2, 8, q] for q in (3, 3, 1) for _ in (4, 3)]
    assert not any(s["shape"][-2:] == [7, 7] and s["bytes"] for s in steps if s["op"] != "input")
    assert [s["shape"] for s in steps if s["op"] == "cat"] == [[2, 8, 7, 64], [2, 8, 7]]  # O and L


def test_at_4096_tokens_no_tensor_is_t_by_t(cli):
    data = json.loads(cli("shapes", "--impl", "tiled", "--seq", "4096", "--block-q", "512", "--block-k", "512",
                          "--device", "meta", "--format", "json").stdout)
    made = [s for s in data["steps"] if s["bytes"] and s["op"] != "input"]
    largest = max(math.prod(s["shape"]) for s in made)
    assert largest == 2 * 4096 * 512  # (B, T, d_model) = B·H·T·d_k: a projection, not a score tile
    assert max(math.prod(s["shape"]) for s in made if s["op"] == "matmul" and len(s["shape"]) == 4
               and s["shape"][-1] == 512) == 2 * 8 * 512 * 512  # one score tile


@pytest.mark.parametrize("args,message", [
    (("--block-q", "3"), "--block-q sets the tiles of the tiled pass: add --impl tiled"),
    (("--impl", "tiled", "--block-k", "0"), "--block-k: block_k=0 must be a positive integer (at least 1)"),
    (("--impl", "tiled", "--seq", "100", "--block-q", "1", "--block-k", "1"),
     "--block-q: block_q=1 and block_k=1 cut seq=100 into 10,000 tiles; a trace walks at most 1,024 (larger blocks)"),
])
def test_tile_option_errors(cli, args, message):
    result = cli("shapes", *args)
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")


def chapter_head(h: int):
    """The chapter's Q, K, V of head h (1-based), its columns, as torch tensors (B = H = 1)."""
    from mha_trace.runs.config import load_config

    c = load_config("cat-sat-on-mat")
    cols = slice((h - 1) * c.d_k, h * c.d_k)
    return [torch.tensor(c.__getattribute__(m), dtype=torch.float64)[:, cols][None, None] for m in "QKV"]


@pytest.mark.parametrize("block_k", [1, 2, 3, 5])
def test_explain_tiled_is_the_online_softmax_of_the_chapters_rows(cli, block_k):
    """After each key tile, o ÷ ℓ is the softmax over the keys seen so far times their values; after
    the last, the row's output and logsumexp, as torch computes them at once."""
    for position, token in enumerate(["The", "cat", "sat", "on", "mat"]):
        data = json.loads(cli("explain", "--token", token, "--impl", "tiled", "--block-k", str(block_k),
                              "--decimals", "10", "--format", "json").stdout)
        for head in data["heads"]:
            Q, K, V = chapter_head(head["head"])
            scores = (Q[0, 0, position] @ K[0, 0].T) / math.sqrt(Q.size(-1))
            seen = 0
            for tile in head["tiles"]:
                seen += len(tile["keys"])
                so_far = torch.softmax(scores[:seen], -1) @ V[0, 0, :seen]
                assert torch.tensor(tile["o"], dtype=torch.float64) / tile["l_new"] == pytest.approx(so_far, abs=1e-9)
                assert tile["m_new"] == pytest.approx(float(scores[:seen].max()), abs=1e-9)
            out, lse = tiled_attention(Q, K, V, block_k=block_k)
            assert head["output"] == pytest.approx(out[0, 0, position].tolist(), abs=1e-9)
            assert head["logsumexp"] == pytest.approx(float(torch.logsumexp(scores, -1)), abs=1e-9)
            assert head["logsumexp"] == pytest.approx(float(lse[0, 0, position]), abs=1e-9)
            assert head["output"] == pytest.approx(head["explicit"], abs=1e-9)


def test_explain_tiled_shows_the_rescale_when_the_max_rises(cli, golden):
    text = cli("explain", "--token", "sat", "--impl", "tiled", "--block-k", "2", "--head", "1").stdout
    golden("explain_tiled_sat.txt", text)
    assert "1.4142   0.4931" in text  # tile 2's 'sat' raises the max 0.7071 to 1.4142: exp(0.7071 - 1.4142)
    assert max(len(line) for line in cli("explain", "--impl", "tiled", "--width", "80").stdout.splitlines()) <= 80


@pytest.mark.parametrize("args,message", [
    (("--impl", "sdpa"), "--impl 'sdpa' never forms the weights to walk: explicit or tiled"),
    (("--block-k", "2"), "--block-k sets the key tiles of the tiled walk: add --impl tiled"),
    (("--impl", "tiled", "--why"), "--impl tiled does not go with --why (the tiled walk shows the online softmax alone)"),
    (("--impl", "tiled", "--block-k", "0"), "--block-k: block_k=0 must be a positive integer (at least 1)"),
    (("--impl", "tiled", "--model", "minilm", "--png", "x.png"),
     "--png: the slide shows at most 4 heads: pick one with --head (e.g. --head 1.1)"),
])
def test_explain_tiled_errors(cli, args, message):
    result = cli("explain", *args)
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")


def test_the_tiled_slide_draws_each_tiles_scores_sums_and_outputs(cli, kept_slides):
    """1920×1080; for each head the scores by tile, ℓ stacked as rescale × ℓ_old + Σ p, and o ÷ ℓ
    after each tile ending on the row's output; looked at in docs/modern.md's story."""
    from mha_trace.render import tiled_slide

    made = kept_slides(tiled_slide)
    data = json.loads(cli("explain", "--token", "sat", "--impl", "tiled", "--block-k", "2", "--format", "json").stdout)
    assert cli("explain", "--token", "sat", "--impl", "tiled", "--block-k", "2", "--png", "x.png").exit_code == 0
    (fig,) = made
    assert tuple(fig.get_size_inches() * fig.dpi) == (1920, 1080)
    axes = [a for a in fig.axes]
    for row, head in zip(np.array(axes).reshape(-1, 3), data["heads"]):
        from matplotlib.collections import PolyCollection

        heights = [h for c in row[0].collections if isinstance(c, PolyCollection) for h in _heights(c)]
        assert heights == pytest.approx([s for t in head["tiles"] for s in t["scores"]], abs=1e-4)
        kept, added = (_heights(c) for c in row[1].collections[:2])
        assert [k + a for k, a in zip(kept, added)] == pytest.approx([t["l_new"] for t in head["tiles"]], abs=1e-4)
        last = [line.get_ydata()[-1] for line in row[2].get_lines() if len(line.get_ydata()) == len(head["tiles"])]
        assert last == pytest.approx(head["output"][:len(last)], abs=1e-4)


def _heights(collection) -> list:
    """The heights of bars drawn as one collection, left to right."""
    return [h for _, h in sorted((p.vertices[0, 0], p.vertices[1, 1] - p.vertices[0, 1])
                                 for p in collection.get_paths())]
