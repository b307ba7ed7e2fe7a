"""`mha-trace shapes` as a user runs it: the table, JSON, the memory guard."""

import json
from pathlib import Path

import pytest

from mha_trace.core.costs import Dims, parameters, peak_bytes


def test_default_table_matches_golden(cli, golden):
    result = cli("shapes")
    assert result.exit_code == 0
    golden("screens/shapes-100x30.txt", result.stdout)


def test_causal_gqa_table_matches_golden(cli, golden):
    result = cli("shapes", "--d-model", "64", "--heads", "8", "--kv-heads", "2", "--seq", "6",
                 "--mask", "causal", "--batch", "1")
    assert result.exit_code == 0
    golden("shapes_causal_gqa.txt", result.stdout)


def test_narrow_table_keeps_stride_and_says_how_to_widen(cli, golden):
    """At 80 columns the stride, which explains contiguity, stays; contig gives way (the caption
    says so), and dtype is in the title since every step has it."""
    result = cli("shapes", "--width", "80")
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80 and len(lines) <= 36
    assert " stride " in lines[1] and " dtype " not in lines[1] and "float32" in lines[0]
    assert "contig hidden at 80 columns (--width 109 shows it)" in result.stdout
    golden("screens/shapes-80x24.txt", result.stdout)


def test_plain_output_has_no_escape_codes_or_trailing_spaces(cli):
    out = cli("shapes").stdout
    assert "\x1b" not in out
    assert all(line == line.rstrip() for line in out.splitlines())
    assert max(len(line) for line in out.splitlines()) <= 100


def test_json_keys_and_l04_shapes(cli):
    data = json.loads(cli("shapes", "--format", "json").stdout)
    assert data["schema_version"] == 2 and data["command"] == "shapes"
    steps = data["steps"]
    shapes = [s["shape"] for s in steps if s["op"] != "input"]
    assert shapes[:3] == [[2, 10, 512], [2, 10, 8, 64], [2, 8, 10, 64]]
    assert shapes[-4:] == [[2, 10, 8, 64], [2, 10, 8, 64], [2, 10, 512], [2, 10, 512]]
    for key in ("shape", "stride", "contiguous", "view", "bytes", "line", "source", "text",
                "dtype", "op", "file"):
        assert all(key in s for s in steps), key
    contiguous = next(s for s in steps if s["op"] == "contiguous")
    assert contiguous["view"] is False and contiguous["bytes"] == 2 * 10 * 512 * 4
    assert data["summary"]["parameters"] == 4 * (512 * 512 + 512)


def test_json_bytes_agree_with_the_memory_estimate(cli):
    """The guard's formula (costs.py) and what the traced run allocated are the same number."""
    for args, dims in [((), Dims(2, 10, 512, 8, 8)),
                       (("--mask", "causal", "--kv-heads", "2", "--dtype", "float64"),
                        Dims(2, 10, 512, 8, 2, "float64", mask="full"))]:
        data = json.loads(cli("shapes", "--format", "json", *args).stdout)
        params = sum(parameters(dims).values()) * dims.itemsize
        assert params + data["summary"]["bytes_allocated"] == peak_bytes(dims)
        assert data["summary"]["parameters"] == sum(parameters(dims).values())


def test_gpt3_scale_on_meta(cli):
    result = cli("shapes", "--device", "meta", "--batch", "1", "--seq", "2048", "--d-model",
                 "12288", "--heads", "96", "--format", "json")
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    scores = next(s for s in data["steps"] if s["shape"] == [1, 96, 2048, 2048])
    assert scores["bytes"] == 96 * 2048 * 2048 * 4  # what an eager run would allocate
    assert all(s["stride"] for s in data["steps"])


def test_memory_guard_refuses_before_allocating(cli):
    result = cli("shapes", "--seq", "300000", "--heads", "96", "--d-model", "12288")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: this run needs about ")
    assert "--device meta" in result.stderr and result.stderr.count("\n") == 1
    assert result.stdout == ""


@pytest.mark.parametrize("args,message", [
    (("--d-model", "10", "--heads", "3"),
     "Error: --heads: d_model=10 is not divisible by heads=3 (valid head counts: 1, 2, 5, 10)\n"),
    (("--batch", "0"), "Error: --batch: batch=0 must be a positive integer (at least 1)\n"),
    (("--seq", "-3"), "Error: --seq: seq=-3 must be a positive integer (at least 1)\n"),
    (("--d-model", "0"), "Error: --d-model: d_model=0 must be a positive integer (at least 1)\n"),
    (("--heads", "0"), "Error: --heads: heads=0 must be a positive integer (at least 1)\n"),
    (("--kv-heads", "3"),
     "Error: --kv-heads: heads=8 is not divisible by kv_heads=3 (valid kv-head counts: 1, 2, 4, 8)\n"),
    (("--pad", "10"), "Error: --pad: pad=10 must be at least 0 and less than seq=10 "
                      "(every query needs one key it may look at)\n"),
    (("--batch", "two"), "Error: Invalid value for '--batch' / '-b': 'two' is not a whole number "
                         "(see: mha-trace shapes --help)\n"),
    (("--dtype", "float8"), "Error: Invalid value for '--dtype': 'float8' is not one of 'float32', "
                            "'float64', 'float16', 'bfloat16' (see: mha-trace shapes --help)\n"),
    (("--width", "39"), "Error: Invalid value for '--width': 39 is less than the minimum, 40 "
                        "(see: mha-trace shapes --help)\n"),
])
def test_bad_input_is_one_line_exit_2(cli, args, message):
    result = cli("shapes", *args)
    assert result.exit_code == 2
    assert result.stderr == message
    assert result.stdout == ""


def test_unknown_option_is_one_line_exit_2(cli):
    result = cli("shapes", "--nope")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: No such option: --nope")
    assert result.stderr.endswith("(see: mha-trace shapes --help)\n")
    assert result.stderr.count("\n") == 1


def test_missing_cuda_is_exit_1(cli):
    import torch

    if torch.cuda.is_available():  # on a GPU machine the same call must simply work
        assert cli("shapes", "--device", "cuda").exit_code == 0
        return
    result = cli("shapes", "--device", "cuda")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: --device cuda was asked for, but CUDA is not available")


def test_shapes_on_a_config_with_and_without_a_module(cli):
    """The command of the chapter "Multi-Head Attention": a config's own tokens and Q, K, V,
    traced through the lecture's module or a student's NumPy class."""
    import json

    from mha_trace.runs.config import load_config

    c = load_config("chicken-road")
    data = json.loads(cli("shapes", "--config", "chicken-road", "--heads", "4", "--format", "json").stdout)
    T = len(c.tokens)
    assert data["steps"][0]["shape"] == [1, T, 64]
    assert [1, 4, T, 16] in [s["shape"] for s in data["steps"] if s["op"] == "transpose"]
    assert [1, 4, T, T] in [s["shape"] for s in data["steps"]]
    chapter = Path(__file__).parents[1] / "examples" / "chapter_numpy_mha.py"
    mine = cli("shapes", "--module", f"{chapter}:MultiHeadAttention", "--config", "cat-sat-on-mat")
    assert mine.exit_code == 0 and 'the config "The cat sat on mat"' in " ".join(mine.stdout.split())
    for flag, value in (("--seq", "5"), ("--batch", "2"), ("--impl", "sdpa"), ("--decode", "2")):
        refused = cli("shapes", "--config", "cat-sat-on-mat", flag, value)
        assert refused.exit_code == 2
        assert refused.stderr == (f"Error: {flag} does not go with --config (a config fixes its "
                                  f"tokens, their Q, K, V and the module)\n")


NUMPY_CLASS = """import numpy as np
class Mine:
    def __init__(self, d_model=64, heads=8):
        rng = np.random.default_rng(0)
        self.heads, self.d_k = heads, d_model // heads
        self.W_q, self.W_k, self.W_v, self.W_o = (rng.normal(size=(d_model, d_model)) for _ in range(4))
    def forward(self, x):
        T, D = x.shape
        q = (x @ self.W_q).reshape(T, self.heads, self.d_k).transpose(1, 0, 2)
        k = (x @ self.W_k).reshape(T, self.heads, self.d_k).transpose(1, 0, 2)
        v = (x @ self.W_v).reshape(T, self.heads, self.d_k).transpose(1, 0, 2)
        s = q @ k.transpose(0, 2, 1) / np.sqrt(self.d_k)
        w = np.exp(s - s.max(-1, keepdims=True))
        w = w / w.sum(-1, keepdims=True)
        return (w @ v).transpose(1, 0, 2).reshape(T, D) @ self.W_o, w
"""


def test_numpy_traces_show_reshapes_count_weights_and_fold_loops(cli, tmp_path):
    path = tmp_path / "mine.py"
    path.write_text(NUMPY_CLASS)
    data = json.loads(cli("shapes", "--module", f"{path}:Mine", "--format", "json").stdout)
    ops = [(s["op"], s["shape"], s["view"]) for s in data["steps"]]
    assert ("reshape", [10, 8, 64], True) in ops and ("transpose", [8, 10, 64], True) in ops
    assert ("reshape", [10, 512], False) in ops  # merging after a transpose copies
    text = cli("shapes", "--module", f"{path}:Mine").stdout
    assert "Parameters: 1,048,576 (W_q 262,144 · W_k 262,144 · W_v 262,144 · W_o 262,144)" in text
    chapter = Path(__file__).parents[1] / "examples" / "chapter_numpy_mha.py"
    folded = cli("shapes", "--module", f"{chapter}:MultiHeadAttention", "--width", "120")
    steps = json.loads(cli("shapes", "--module", f"{chapter}:MultiHeadAttention", "--format",
                           "json").stdout)["steps"]
    assert len(steps) == 3 + 3 * 8 + 9 * 8 + 1  # JSON keeps every pass of the loops
    assert folded.stdout.count("↻ row 3 ran ×24 (rows 4–26 not shown)") == 1  # fits at 120
    assert folded.stdout.count("↻ rows 27–35 ran ×8 (rows 36–98 not shown)") == 1
    assert ("Loops: row 3 ran ×24 (rows 4–26 not shown); rows 27–35 ran ×8 (rows 36–98 not "
            "shown); --format json keeps every pass.") in " ".join(folded.stdout.split())
    narrow = cli("shapes", "--module", f"{chapter}:MultiHeadAttention", "--width", "80").stdout
    assert "↻ ran ×24 (see Loops)" in narrow and "…" not in narrow.split("Source:")[1]
    shown = [line.split()[0] for line in folded.stdout.splitlines() if line[:3].strip().isdigit()]
    assert shown == [str(i) for i in (0, 1, 2, 3, *range(27, 36), 99)]


def test_the_notes_explain_every_change_of_layout_and_each_copy(cli, tmp_path):
    """A module written with reshape, permute, .mT and flatten: each gets its plain words, and a
    flatten that had to copy (its input not contiguous) says so and why."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent / "student"))
    from zoo import correct_module

    path = tmp_path / "mt.py"
    path.write_text(correct_module(".mT and permute"))
    text = cli("shapes", "--module", f"{path}:Attention", "--d-model", "32", "--heads", "4",
               "--seq", "5", "--width", "300").stdout  # the temporary path on one line
    notes = text.split("What the reshapes did here:")[1].split("forward returned")[0]
    for op in ("view", "reshape", "transpose", "mT", "permute"):
        assert f"  {op} " in notes
    assert "flatten    row 16: copied 1.2 KiB: its input was not contiguous" in notes


def test_a_modules_own_kv_heads_are_read_off_its_run(cli):
    """A grouped-query module builds its own K/V heads (with --module, shapes gives its
    constructor heads // 2): the note counts the copies its repeat_interleave made (it used to
    fail for want of --kv-heads, which is the built-in module's flag)."""
    world = Path(__file__).parent / "world" / "gqa_sdpa.py"
    result = cli("shapes", "--module", f"{world}:GroupedQueryAttention", "--d-model", "32",
                 "--heads", "8")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "each K/V head copied for 2 query heads" in " ".join(result.stdout.split())
