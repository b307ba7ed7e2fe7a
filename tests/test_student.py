"""verify --module: a student's own class against the lecture's module, and what went wrong."""

import inspect
import json
import pathlib

import numpy as np

import pytest

S = "tests/student/student_bugs.py:"


def student_runs(spec: str, **options):
    """The student's module as verify --module resolves it."""
    from mha_trace.runs.resolve import RunOptions
    from mha_trace.runs.student import resolve_student

    return resolve_student(RunOptions(module=spec, **options))


def check_module(runs, given_map):
    from mha_trace.analyses.student import check_module

    return check_module(runs, given_map)


@pytest.mark.parametrize("spec,args", [
    ("tests/student/correct_renamed.py:Attention", ("--mask", "causal")),  # other names, permute
    ("tests/student/fused_qkv.py:FusedAttention", ()),  # one fused projection, no weights returned
    ("torch.nn:MultiheadAttention", ("--mask", "causal")),
    ("example:l04", ()), ("example:committee", ("--mask", "causal")), ("example:raschka", ()),
    ("example:reference_sheet", ()), (S + "Correct", ("--mask", "causal")),
    ("example:chapter_numpy", ()), ("example:chapter_torch", ("--mask", "causal")),  # NumPy without weights
])
def test_correct_modules_pass(cli, spec, args):
    result = cli("verify", "--module", spec, "--d-model", "32", "--heads", "4", *args, "--format", "json")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["passed"] and data["output_max_abs_diff"] < 1e-10


@pytest.mark.parametrize("cls,args,diagnosis,line", [
    ("ScaledByDk", (), "scaled by d_k instead of √d_k", 26),
    ("NotScaled", (), "not scaled at all", 26),
    ("WrongAxis", (), "softmax over the queries instead of the keys", 32),
    ("MergedWithoutTranspose", (), "heads merged without transposing back", 37),
    ("MaskInverted", ("--mask", "causal", "--mask-means", "keep"), "mask inverted", 31),
    ("MaskOffByOne", ("--mask", "causal"), "mask off by one (a query sees one key ahead)", 31),
    ("KNotTransposed", ("--seq", "8"), "K not transposed", 25),
    ("NoWO", (), "W_O missing", 40),  # its return line
    ("NoBias", (), "bias missing", 21),
    ("ScaledBySqrtDModel", (), "scaled by √d_model instead of √d_k", 26),
    ("QInPlaceOfK", (), "Q in place of K (scores Q·Qᵀ)", 25),
    ("WeightsTimesK", (), "weights applied to K instead of V", 35),
    ("MaskAfterSoftmax", ("--mask", "causal"), "mask applied after the softmax (rows no longer sum to 1)", 26),
    ("SoftmaxOverHeads", (), "softmax over the heads instead of the keys", 32),
])
def test_each_bug_is_caught_and_named(cli, cls, args, diagnosis, line):
    result = cli("verify", "--module", S + cls, "--d-model", "32", "--heads", "4", *args,
                 "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert not data["passed"] and data["diagnosis"] == diagnosis
    wrong = data["first_wrong_step"]
    assert (wrong["line"] if wrong else None) == line


@pytest.mark.parametrize("mask", [(), ("--mask", "causal")])
def test_a_module_that_masks_by_itself_is_a_decoder_and_right_with_or_without_mask_causal(cli, mask):
    """nanoGPT's forward(x) takes no mask and is always causal: it is compared with the lecture's
    causal module, said so, and never told to make a decoder non-causal; no padding for it."""
    data = json.loads(cli("verify", "--module", "example:nanogpt", "--d-model", "32", "--heads", "4",
                          *mask, "--format", "json").stdout)
    assert data["passed"] and data["diagnosis"] is None
    assert any(n.startswith("it masks causally by itself") for n in data["notes"])
    refused = cli("verify", "--module", "example:nanogpt", "--pad", "2")
    assert refused.exit_code == 2 and refused.stderr == (
        "Error: --pad: CausalSelfAttention.forward takes no mask argument, so no padding mask can be "
        "applied\n")


def test_the_mapping_is_printed_and_can_be_given(cli, tmp_path):
    out = cli("verify", "--module", "example:l04", "--d-model", "32", "--heads", "4").stdout
    assert "Projections found by name: q=W_q, k=W_k, v=W_v, o=W_o; called as forward(q, k, v)." in out
    odd = tmp_path / "odd.py"
    odd.write_text(open("tests/student/correct_renamed.py").read().replace("self.query", "self.a")
                   .replace("self.key", "self.b").replace("self.value", "self.c").replace("self.out", "self.d"))
    data = json.loads(cli("verify", "--module", f"{odd}:Attention", "--d-model", "32", "--heads", "4",
                          "--format", "json").stdout)
    assert data["passed"] and data["mapping"] == "q=a, k=b, v=c, o=d (by data flow)"
    given = json.loads(cli("verify", "--module", f"{odd}:Attention", "--d-model", "32", "--heads", "4",
                           "--map", "q=a,k=b,v=c,o=d", "--format", "json").stdout)
    assert given["passed"] and given["mapping"] == "q=a, k=b, v=c, o=d (--map)"
    bad = cli("verify", "--module", f"{odd}:Attention", "--map", "q=zz")
    assert bad.exit_code == 2 and bad.stderr.startswith("Error: --map: 'q=zz' is not ROLE=NAME")
    assert "(found: a [64, 64], b [64, 64], c [64, 64], d [64, 64])" in bad.stderr


def test_the_first_wrong_step_shows_both_sides(cli):
    out = cli("verify", "--module", S + "ScaledByDk", "--d-model", "32", "--heads", "4").stdout
    assert "First wrong step: tests/student/student_bugs.py:26" in out
    assert "  yours: div [2, 4, 6, 6]" in out and "  the lecture's: div [2, 4, 6, 6]" in out


@pytest.mark.parametrize("command", ["compare", "ablate"])
def test_compare_and_ablate_say_why_not_with_a_module(cli, command):
    result = cli(command, "--module", "example:l04")
    assert result.exit_code == 2 and result.stderr.startswith("Error: --module: ")
    assert "lecture's module" in result.stderr


def test_the_chapters_numpy_class_is_traced_op_by_op(cli):
    data = json.loads(cli("shapes", "--module", "example:chapter_numpy", "--d-model", "4", "--heads",
                          "2", "--seq", "5", "--format", "json").stdout)
    steps = [(s["op"], s["shape"], s["view"]) for s in data["steps"]]
    assert steps[:3] == [("input", [5, 4], False)] * 3  # one unbatched sequence, as the chapter runs it
    assert ("index", [5, 2], True) in steps  # M[:, start:end]: a view of the columns
    assert ("transpose", [2, 5], True) in steps  # Kh.T: a view
    assert ("matmul", [5, 5], False) in steps and steps[-1] == ("hstack", [5, 4], False)
    slices = [s for s in data["steps"] if s["op"] == "index"]
    assert all(s["text"] == "M[:, start:end]" and s["bytes"] == 0 for s in slices)


def test_the_chapters_numpy_class_gives_the_chapters_numbers(cli):
    heads = json.loads(cli("heads", "--module", "example:chapter_numpy", "--config", "cat-sat-on-mat",
                           "--format", "json").stdout)
    ours = json.loads(cli("heads", "--format", "json").stdout)
    # numpy's exp and torch's may differ in the last bit (numpy 2.4: 5.6e-17), nothing more
    assert np.allclose([h["weights"] for h in heads["heads"]], [h["weights"] for h in ours["heads"]],
                       rtol=0, atol=1e-15)
    assert np.allclose(heads["output"], ours["output"], rtol=0, atol=1e-15)
    walk = cli("explain", "--module", "example:chapter_numpy", "--config", "cat-sat-on-mat",
               "--token", "The").stdout
    assert "Output for 'The': [0.2491, 0.3763, 0.2289, 0.3663]" in walk  # the chapter's row


def test_verify_checks_a_numpy_class_and_finds_its_bug(cli, tmp_path):
    ok = json.loads(cli("verify", "--module", "example:chapter_numpy", "--d-model", "4", "--heads", "2",
                        "--format", "json").stdout)
    assert ok["passed"] and "set to the identity" in ok["mapping"]
    buggy = tmp_path / "numpy_bug.py"
    buggy.write_text(open("examples/chapter_numpy_mha.py").read().replace(
        "scaled = scores / self.scale", "scaled = scores / self.d_k"))
    result = cli("verify", "--module", f"{buggy}:MultiHeadAttention", "--d-model", "8", "--heads", "2",
                 "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and data["diagnosis"] == "scaled by d_k instead of √d_k"
    assert data["first_wrong_step"]["source"] == "scaled = scores / self.d_k"


def test_the_chapters_torch_class_is_told_its_mask_convention(cli):
    """It takes True as *blocked* (as nn.MultiheadAttention does): it is right under that
    convention and told so; held to the lecture's (--mask-means keep) its mask is inverted."""
    args = ("verify", "--module", "example:chapter_torch", "--d-model", "8", "--heads", "2", "--mask", "causal")
    data = json.loads(cli(*args, "--format", "json").stdout)
    assert data["passed"] and any(n.startswith("its mask means True where a query may NOT attend")
                                  for n in data["notes"])
    held = cli(*args, "--mask-means", "keep", "--format", "json")
    assert held.exit_code == 1 and json.loads(held.stdout)["diagnosis"] == "mask inverted"
    blocked = json.loads(cli(*args, "--mask-means", "blocked", "--format", "json").stdout)
    assert blocked["passed"]
    refused = cli("verify", "--mask-means", "keep")
    assert refused.exit_code == 2 and "--mask-means" in refused.stderr


@pytest.mark.parametrize("spec", ["example:chapter_torch", "example:chapter_numpy", "example:raschka"])
def test_verify_on_the_chapters_config_feeds_its_q_k_v(cli, spec):
    data = json.loads(cli("verify", "--module", spec, "--config", "cat-sat-on-mat", "--format", "json").stdout)
    assert data["passed"] and data["mapping"].startswith("(projections none: the config's Q, K, V")
    assert data["output_max_abs_diff"] < 1e-12 and data["weights_max_abs_diff"] < 1e-12


def test_verify_on_a_config_finds_a_bug(cli):
    result = cli("verify", "--module", S + "ScaledByDk", "--config", "cat-sat-on-mat", "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and data["diagnosis"] == "scaled by d_k instead of √d_k"
    assert any("checked on seeded input at the config's sizes" in n for n in data["notes"])


def test_a_failing_module_is_named_at_its_line_with_the_fix_as_shapes_does(cli):
    shapes = cli("shapes", "--module", "example:broken_view")
    verify = cli("verify", "--module", "example:broken_view")
    assert verify.exit_code == shapes.exit_code == 1
    line = verify.stderr.strip()
    assert line.startswith("Error: MultiHeadAttention from example:broken_view: forward raised at "
                           "examples/broken_view.py:22 (context = (weights @ v).transpose(1, 2)")
    assert line.endswith("(hint: the input to .view() is not contiguous (a transpose made it so); "
                         "call .contiguous() first, or use .reshape())")
    assert "examples/broken_view.py:22" in shapes.stdout + shapes.stderr
    assert len(verify.stderr.splitlines()) == 1


# weights wherever they are: parameters and NumPy arrays, either way round --------------------

def _variant(numpy: bool, xw: bool, permute: bool, weights_out: bool) -> str:
    """A correct attention module written one of 16 ways."""
    mat = (lambda name: f"self.{name}") if xw else (lambda name: f"self.{name}.T")
    if numpy:
        head = ("import numpy as np\nclass M:\n    def __init__(self, d_model=64, heads=8):\n"
                "        r = np.random.default_rng(1)\n"
                "        self.h, self.dk = heads, d_model // heads\n"
                "        self.W_q, self.W_k, self.W_v, self.W_o = (r.normal(size=(d_model, d_model)) for _ in range(4))\n"
                "    def forward(self, x):\n        T, D = x.shape\n")
        split = ("        sp = lambda t: t.reshape(T, self.h, self.dk).transpose(1, 0, 2)\n" if not permute else
                 "        sp = lambda t: np.transpose(t.reshape(T, self.h, self.dk), (1, 0, 2))\n")
        body = (f"        q, k, v = sp(x @ {mat('W_q')}), sp(x @ {mat('W_k')}), sp(x @ {mat('W_v')})\n"
                "        s = q @ k.transpose(0, 2, 1) / np.sqrt(self.dk)\n"
                "        w = np.exp(s - s.max(-1, keepdims=True))\n        w = w / w.sum(-1, keepdims=True)\n"
                f"        out = (w @ v).transpose(1, 0, 2).reshape(T, D) @ {mat('W_o')}\n")
    else:
        head = ("import math, torch, torch.nn as nn\nclass M(nn.Module):\n"
                "    def __init__(self, d_model=64, heads=8):\n        super().__init__()\n"
                "        self.h, self.dk = heads, d_model // heads\n"
                "        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Parameter(torch.randn(d_model, d_model)) for _ in range(4))\n"
                "    def forward(self, x):\n        B, T, D = x.shape\n")
        split = ("        sp = lambda t: t.view(B, T, self.h, self.dk).transpose(1, 2)\n" if not permute else
                 "        sp = lambda t: t.reshape(B, T, self.h, self.dk).permute(0, 2, 1, 3)\n")
        body = (f"        q, k, v = sp(x @ {mat('W_q')}), sp(x @ {mat('W_k')}), sp(x @ {mat('W_v')})\n"
                "        w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.dk), -1)\n"
                f"        out = (w @ v).transpose(1, 2).reshape(B, T, D) @ {mat('W_o')}\n")
    return head + split + body + ("        return out, w\n" if weights_out else "        return out\n")


VARIANTS = [(n, xw, p, w) for n in (False, True) for xw in (False, True) for p in (False, True)
            for w in (False, True)]


@pytest.mark.parametrize("numpy,xw,permute,weights_out", VARIANTS,
                         ids=[f"{'numpy' if n else 'torch'}-{'xW' if xw else 'xWT'}-{'permute' if p else 'view'}-"
                              f"{'w' if w else 'no-w'}" for n, xw, p, w in VARIANTS])
def test_correct_modules_with_bare_weight_matrices_pass(cli, tmp_path, numpy, xw, permute, weights_out):
    path = tmp_path / "variant.py"
    path.write_text(_variant(numpy, xw, permute, weights_out))
    result = cli("verify", "--module", f"{path}:M", "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["passed"], result.stdout
    assert data["mapping"] == "q=W_q, k=W_k, v=W_v, o=W_o (by name)"
    text = cli("verify", "--module", f"{path}:M").stdout
    assert f"used as {'x @ W' if xw else 'x @ W.T'} (both ways round were tried)" in " ".join(text.split())


FUSED = {  # (how the fused projection is held, how it is called)
    "linear": ("nn.Linear(d_model, 3 * d_model)", "self.qkv(x)"),
    "param-xW": ("nn.Parameter(torch.randn(d_model, 3 * d_model))", "x @ self.qkv"),
    "param-xWT": ("nn.Parameter(torch.randn(3 * d_model, d_model))", "x @ self.qkv.T"),
    "param-linear": ("nn.Parameter(torch.randn(3 * d_model, d_model))",
                     "nn.functional.linear(x, self.qkv)"),
}


@pytest.mark.parametrize("fused", sorted(FUSED))
@pytest.mark.parametrize("chunk", ["split", "chunk"])
def test_correct_fused_modules_pass_however_the_weight_is_held(cli, tmp_path, fused, chunk):
    held, called = FUSED[fused]
    cut = "q, k, v = qkv.split(D, -1)" if chunk == "split" else "q, k, v = qkv.chunk(3, dim=-1)"
    path = tmp_path / "fused.py"
    path.write_text(
        "import math, torch, torch.nn as nn\nclass M(nn.Module):\n"
        "    def __init__(self, d_model=64, heads=8):\n        super().__init__()\n"
        f"        self.h, self.dk = heads, d_model // heads\n        self.qkv = {held}\n"
        "        self.proj = nn.Linear(d_model, d_model, bias=False)\n"
        "    def forward(self, x):\n        B, T, D = x.shape\n"
        f"        qkv = {called}\n        {cut}\n"
        "        sp = lambda t: t.reshape(B, T, self.h, self.dk).transpose(1, 2)\n"
        "        w = torch.softmax(sp(q) @ sp(k).transpose(-2, -1) / math.sqrt(self.dk), -1)\n"
        "        return self.proj((w @ sp(v)).transpose(1, 2).reshape(B, T, D)), w\n")
    data = json.loads(cli("verify", "--module", f"{path}:M", "--format", "json").stdout)
    assert data["passed"] and data["mapping"] == "qkv=qkv, o=proj (by name)", data


def test_bare_matrices_map_by_map_or_say_what_was_found(cli, tmp_path):
    path = tmp_path / "variant.py"
    path.write_text(_variant(True, True, False, True).replace("W_q", "A").replace("W_k", "B")
                    .replace("W_v", "C").replace("W_o", "D"))
    given = json.loads(cli("verify", "--module", f"{path}:M", "--map", "q=A,k=B,v=C,o=D",
                           "--format", "json").stdout)
    assert given["passed"] and given["mapping"] == "q=A, k=B, v=C, o=D (--map)"
    wrong_way = json.loads(cli("verify", "--module", f"{path}:M", "--map", "q=B,k=A,v=C,o=D",
                               "--format", "json").stdout)
    assert not wrong_way["passed"]  # the map is honoured, even when it is wrong
    heads = tmp_path / "per_head.py"
    heads.write_text("import torch.nn as nn\nclass M(nn.Module):\n"
                     "    def __init__(self, d_model=64, heads=8):\n        super().__init__()\n"
                     "        self.q = nn.ModuleList(nn.Linear(d_model, d_model // heads) for _ in range(heads))\n"
                     "        self.v = nn.Linear(d_model, 2 * d_model)\n"
                     "    def forward(self, x):\n        return x\n")
    refused = cli("verify", "--module", f"{heads}:M")
    assert refused.exit_code == 2 and refused.stdout == ""  # a per-head list, but no K and a V too wide
    assert refused.stderr.startswith("Error: --map: could not map your weights: found v [128, 64], "
                                     "q.* [64, 64]"), refused.stderr


@pytest.mark.parametrize("cls,diagnosis", [("ScaledByDk", "scaled by d_k instead of √d_k"),
                                           ("ScaledBySqrtDModel", "scaled by √d_model instead of √d_k")])
def test_a_diagnosis_holds_at_two_sizes(cli, cls, diagnosis):
    """At d_model = 64 and 8 heads, √d_model = d_k = 8: both mistakes give the same numbers, so
    the diagnosis is only named if it gives the student's numbers at twice the width too."""
    report = check_module(student_runs(S + cls, d_model=64, heads=8), None)
    assert not report.passed and set(report.candidates) == {"scaled by d_k instead of √d_k",
                                                            "scaled by √d_model instead of √d_k"}
    assert report.diagnosis == diagnosis
    data = json.loads(cli("verify", "--module", S + cls, "--d-model", "64", "--heads", "8",
                          "--format", "json").stdout)
    assert data["diagnosis"] == diagnosis


def test_a_diagnosis_seen_at_one_size_only_is_not_named(tmp_path):
    """A module whose mistake only looks like a known one at one width (it divides by 8 whatever
    the width) is not given that name."""
    path = tmp_path / "eight.py"
    path.write_text(open(S[:-1]).read().replace('"no_scale": 1,', '"no_scale": 1, "eight": 8.0,')
                    + "\nclass Eight(Base): bug = 'eight'\n")
    report = check_module(student_runs(f"{path}:Eight", d_model=64, heads=8), None)
    assert report.candidates and report.diagnosis is None
    assert any("but not at 128, so none is named" in n for n in report.notes)


def test_the_first_wrong_step_is_where_the_layout_goes_wrong(cli, tmp_path):
    """Right numbers in the wrong places are found where they were put there: a merge without
    transposing back at its reshape (beside the lecture's view, with the first position that
    differs), and k.transpose(1, 3), which runs when heads = d_k = seq, at the transpose."""
    out = cli("verify", "--module", S + "MergedWithoutTranspose", "--d-model", "32", "--heads", "4").stdout
    flat = " ".join(out.split())
    assert "First wrong step: tests/student/student_bugs.py:37 context = context.reshape(B, T, self.d_model)" in flat
    from mha_trace.core import attention

    merge = next(i for i, line in enumerate(inspect.getsource(attention).splitlines(), 1)
                 if line.strip().startswith("context = context.transpose(1, 2)"))
    assert "the lecture's: view [2, 6, 32]" in flat and f"(attention.py:{merge} context =" in flat
    assert "first different at [0, 0, 8]: yours" in flat
    path = tmp_path / "t13.py"
    path.write_text(open("tests/student/correct_renamed.py").read()
                    .replace("k.permute(0, 1, 3, 2)", "k.transpose(1, 3)"))
    data = json.loads(cli("verify", "--module", f"{path}:Attention", "--d-model", "16", "--heads", "4",
                          "--seq", "4", "--format", "json").stdout)
    assert not data["passed"]
    wrong = data["first_wrong_step"]
    assert (wrong["op"], wrong["line"]) == ("transpose", 20), wrong


# more ways to write it right: einsum or unbind, a scale by power, masks of numbers, one sequence -----

def _written(style: str, scale: str, mask: str, batched: bool) -> str:
    """A correct module written one of 24 ways."""
    split = {"einsum": ("self.W_q, self.W_k, self.W_v = (nn.Linear(d_model, d_model) for _ in range(3))",
                        "q, k, v = (sp(w(x)) for w in (self.W_q, self.W_k, self.W_v))"),
             "unbind": ("self.qkv = nn.Linear(d_model, 3 * d_model)",
                        "q, k, v = (t.transpose(-3, -2) for t in self.qkv(x).view(*lead, 3, self.h, self.dk).unbind(-3))")}[style]
    scores = "torch.einsum('...qd,...kd->...qk', q, k)" if style == "einsum" else "q @ k.transpose(-2, -1)"
    scaled = {"sqrt": f"{scores} / math.sqrt(self.dk)", "power": f"{scores} * self.dk ** -0.5"}[scale]
    masked = {"bool": "s = s.masked_fill(~mask, float('-inf'))", "additive": "s = s + mask",
              "0-1": "s = s.masked_fill((1 - mask).bool(), float('-inf'))"}[mask]
    mix = "torch.einsum('...qk,...kd->...qd', w, v)" if style == "einsum" else "(w @ v)"
    return ("import math, torch, torch.nn as nn\nclass M(nn.Module):\n"
            "    def __init__(self, d_model, num_heads):\n        super().__init__()\n"
            "        self.h, self.dk = num_heads, d_model // num_heads\n"
            f"        {split[0]}\n        self.out_proj = nn.Linear(d_model, d_model)\n"
            "    def forward(self, x, attn_mask=None):\n        mask = attn_mask\n"
            + ("        B, T, D = x.shape\n        lead = (B, T)\n" if batched else
               "        T, D = x.shape\n        lead = (T,)\n")
            + "        sp = lambda t: t.view(*lead, self.h, self.dk).transpose(-3, -2)\n"
            f"        {split[1]}\n        s = {scaled}\n"
            f"        if mask is not None:\n            {masked}\n"
            f"        w = torch.softmax(s, dim=-1)\n"
            f"        return self.out_proj({mix}.transpose(-3, -2).reshape(*lead, D)), w\n")


# every value of each way appears with every value of the others at least once (12 of 24)
WRITTEN = [(st, sc, m, b) for st in ("einsum", "unbind") for m in ("bool", "additive", "0-1")
           for b in (True, False) for sc in [("sqrt", "power")[(st == "einsum") ^ b]]]


@pytest.mark.parametrize("style,scale,mask,batched", WRITTEN,
                         ids=["-".join([st, sc, m, "batched" if b else "one-sequence"]) for st, sc, m, b in WRITTEN])
def test_correct_modules_written_other_ways_pass(cli, tmp_path, style, scale, mask, batched):
    path = tmp_path / "written.py"
    path.write_text(_written(style, scale, mask, batched))
    result = cli("verify", "--module", f"{path}:M", "--mask", "causal", "--d-model", "32", "--heads", "4")
    assert result.exit_code == 0, result.stdout + result.stderr
    flat = " ".join(result.stdout.split())
    assert "Right: it computes what the lecture's module computes." in flat
    said = {"bool": None, "0-1": "its mask is read as numbers, 1 where a query may attend",
            "additive": "its mask is added to the scores: 0 where a query may attend, -inf where not"}[mask]
    assert said is None or said[1:] in flat
    assert ("unbatched" in flat) is (not batched)


@pytest.mark.parametrize("spec,mapping", [
    ("tests/student/per_head.py:HeadList", "q=heads.*.query, k=heads.*.key, v=heads.*.value, o=proj (by name)"),
    ("tests/student/per_head.py:LinearLists", "q=q_heads.*, k=k_heads.*, v=v_heads.*, o=out (by name)"),
])
def test_per_head_projections_are_found_and_filled_head_by_head(cli, spec, mapping):
    data = json.loads(cli("verify", "--module", spec, "--mask", "causal", "--d-model", "32", "--heads", "4",
                          "--format", "json").stdout)
    assert data["passed"] and data["mapping"] == mapping, data


# the step that does the job wrong, role by role ---------------------------------------------

def test_a_missing_job_is_named_after_the_step_it_should_follow(cli, tmp_path):
    """No scale line: named at the scores line, saying the lecture divides by √d_k after it (with
    a mask too, whose line then holds wrong numbers for the right reason). A mask applied after
    the softmax: named at the scale line, saying the lecture masks after it. A NumPy class
    without the scale: at its scores line, not inside its hand-written softmax."""
    unscaled = tmp_path / "unscaled.py"
    unscaled.write_text(open(S[:-1]).read().replace(
        "        scores = scores / {", "        pass  # scores / {").replace("math.sqrt(self.d_k))", "math.sqrt(self.d_k)"))
    for mask in ("none", "causal"):
        data = json.loads(cli("verify", "--module", f"{unscaled}:Correct", "--d-model", "32", "--heads", "4",
                              "--mask", mask, "--format", "json").stdout)
        wrong = data["first_wrong_step"]
        assert (wrong["line"], data["diagnosis"]) == (25, "not scaled at all"), (mask, wrong)
        assert wrong["missing_after_it"].startswith("after this step the lecture's module divides the scores by √d_k")
    after = json.loads(cli("verify", "--module", S + "MaskAfterSoftmax", "--d-model", "32", "--heads", "4",
                           "--mask", "causal", "--format", "json").stdout)["first_wrong_step"]
    assert after["line"] == 26 and after["missing_after_it"].startswith("after this step the lecture's module masks the scores")
    numpy = tmp_path / "chapter.py"
    numpy.write_text(open("examples/chapter_numpy_mha.py").read().replace("scores / self.scale", "scores"))
    data = json.loads(cli("verify", "--module", f"{numpy}:MultiHeadAttention", "--d-model", "32", "--heads", "4",
                          "--format", "json").stdout)
    assert data["diagnosis"] == "not scaled at all"
    assert data["first_wrong_step"]["source"] == "scores = Qh @ Kh.T", data["first_wrong_step"]


R = "tests/student/rope_modules.py:"


def test_rope_modules_pass_under_rope_in_either_convention_and_rope_on_v_is_named(cli):
    """--rope with --module: the lecture's module turns Q and K; a student's RoPE over the two
    halves passes as it is, one over neighbouring pairs passes as a convention (it is the lecture's
    with each head's dims reordered), and turning V too is caught at the call that does it."""
    args = ("--rope", "--mask", "causal", "--d-model", "32", "--heads", "4", "--format", "json")
    halves = json.loads(cli("verify", "--module", R + "RotaryAttention", *args).stdout)
    assert halves["passed"] and halves["output_max_abs_diff"] < 1e-12 and \
        [n for n in halves["notes"] if not n.startswith("its boolean mask was read")] == []  # no convention of RoPE
    pairs = json.loads(cli("verify", "--module", R + "RotaryPairs", *args).stdout)
    assert pairs["passed"] and pairs["output_max_abs_diff"] < 1e-12
    assert any("a convention, not a mistake" in n for n in pairs["notes"])
    unturned = cli("verify", "--module", R + "RotaryAttention", *args[1:])
    assert (unturned.exit_code, unturned.stderr) == (2, (  # without --rope the lecture's does not turn
        "Error: --rope: RotaryAttention turns Q and K by their positions (rotary positions, RoPE), "
        "which the lecture's module does with --rope: check it with --rope (with it, it is right)\n"))
    on_v = cli("verify", "--module", R + "RotaryOnV", *args)
    data = json.loads(on_v.stdout)
    assert on_v.exit_code == 1 and data["diagnosis"] == "RoPE applied to V too"
    assert data["first_wrong_step"]["called_from"] == 43  # inside rope_halves, turning V
    assert data["first_wrong_step"]["line"] in (16, 17)
    text = " ".join(cli("verify", "--module", R + "RotaryOnV", *args[:-2]).stdout.split())
    assert "called from line 43 v = self.turn(v) if self.on_v else v" in text


@pytest.mark.parametrize("cls,mapping", [
    ("SeparateBiases", "q=W_q+b_q, k=W_k+b_k, v=W_v+b_v, o=W_o+b_o (by name)"),
    ("FLinear", "q=q_weight+q_bias, k=k_weight+k_bias, v=v_weight+v_bias, o=o_weight+o_bias (by "
                "name)"),
    ("NumpyBiases", "q=W_q+b_q, k=W_k+b_k, v=W_v+b_v, o=W_o+b_o (by name)"),
])
@pytest.mark.parametrize("sizes", [("--d-model", "32", "--heads", "4"), ("--d-model", "24", "--heads", "3")])
def test_biases_held_beside_bare_matrices_get_the_lectures(cli, cls, mapping, sizes):
    """x @ W + b and F.linear(x, W, b) with biases of their own: Right, never Wrong for where the
    bias lives (they used to keep their random biases against a bias-free reference)."""
    result = cli("verify", "--module", f"tests/student/separate_biases.py:{cls}", *sizes, "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["passed"], result.stdout
    assert data["mapping"] == mapping


def test_a_bias_defined_and_never_added_is_still_wrong(cli):
    result = cli("verify", "--module", "tests/student/separate_biases.py:BiasForgotten",
                 "--d-model", "32", "--heads", "4", "--format", "json")
    assert result.exit_code == 1 and not json.loads(result.stdout)["passed"]


def test_biases_under_names_that_say_nothing_are_zeroed_and_said(cli, tmp_path):
    path = tmp_path / "odd_bias.py"
    path.write_text(open("tests/student/separate_biases.py").read().replace("b_{n}", "bias{'qkvo'.index(n)}")
                    .replace("self.b_q", "self.bias0").replace("self.b_k", "self.bias1")
                    .replace("self.b_v", "self.bias2").replace("self.b_o", "self.bias3"))
    result = cli("verify", "--module", f"{path}:SeparateBiases", "--d-model", "32", "--heads", "4")
    assert result.exit_code == 0, result.stdout
    text = " ".join(result.stdout.split())
    assert ("The biases bias0, bias1, bias2, bias3 were set to zero, as were the reference's: no "
            "projection's name claims them.") in text


@pytest.mark.parametrize("sizes", [("--d-model", "32", "--heads", "4"), ("--d-model", "24", "--heads", "3")])
def test_matrices_with_names_that_say_nothing_are_mapped_by_what_they_do(cli, sizes):
    """a, b, c, d defined in the order o, v, k, q: the data flow says which is which (mapping them
    in the order defined used to call a correct module Wrong, and a wrong one could not be mapped
    at all); so a wrong one is Wrong at its line, its mistake named."""
    spec = "tests/student/unnamed_order.py:"
    result = cli("verify", "--module", spec + "Abcd", *sizes, "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 0 and data["passed"], result.stdout
    assert data["mapping"] == "q=d, k=c, v=b, o=a (by data flow)"
    wrong = json.loads(cli("verify", "--module", spec + "AbcdWrong", *sizes, "--format", "json").stdout)
    assert wrong["mapping"] == "q=d, k=c, v=b, o=a (by data flow)"
    assert (wrong["diagnosis"], wrong["first_wrong_step"]["line"]) == ("scaled by d_k instead of √d_k", 27)


@pytest.mark.parametrize("sizes", [("--d-model", "32", "--heads", "4"), ("--d-model", "24", "--heads", "3")])
def test_a_numpy_class_written_for_a_batch_is_fed_one(cli, sizes):
    """B, T, D = x.shape in a NumPy class: fed a batch, Right, and the report says so (NumPy
    classes used to get one sequence only, and the student's correct line the blame)."""
    result = cli("verify", "--module", "tests/student/batched_numpy.py:BatchedNumpy", *sizes)
    assert result.exit_code == 0, result.stdout
    text = " ".join(result.stdout.split())
    assert "It takes a batch (B, T, d_model), so it was fed one." in text and "Right:" in text


COURSE_STYLES = "tests/student/course_styles.py"


@pytest.mark.parametrize("cls,course,right", [
    ("MultiHeadAttention", "cs231n", True), ("InvertedMask", "cs231n", False),
    ("Eecs498Style", "eecs498", True), ("Eecs498Style", "cs231n", False),
    ("MultiHeadAttention", "eecs498", False), ("InvertedMask", "eecs498", True)])
def test_a_course_profile_holds_the_mask_to_its_reading(cli, cls, course, right):
    """Under a course's profile a mask read the other way round is Wrong, named, and fixed in the
    course's words (without one it was Right, with a note): CS231n's nonzero where a query may
    attend, EECS 498's True where it may not."""
    result = cli("verify", "--module", f"{COURSE_STYLES}:{cls}", "--course", course, "--format", "json")
    data = json.loads(result.stdout)
    assert (result.exit_code, data["passed"]) == ((0, True) if right else (1, False))
    assert data["notes"][0].startswith(f"checked under the {course} profile")
    if not right:
        assert data["diagnosis"] == "mask inverted"
        assert data["fix"] == ("fill where the mask is True: in eecs498 True means a query may NOT look"
                               if course == "eecs498" else "fill where the mask is False (== 0): in "
                               "cs231n True (nonzero) means a query may look")
    assert not any(n.startswith("its mask means True where a query may NOT") for n in data["notes"])


def test_without_a_profile_either_reading_passes_and_which_is_said(cli):
    """No course named: the inverted class is Right under the other reading, saying which; the
    class read as the lecture reads it is told that a course may mean the opposite."""
    args = ("verify", "--mask", "causal", "--format", "json", "--module")
    inverted = json.loads(cli(*args, f"{COURSE_STYLES}:InvertedMask").stdout)
    assert inverted["passed"] and any(n.startswith("its mask means True where a query may NOT")
                                      for n in inverted["notes"])
    kept = json.loads(cli(*args, f"{COURSE_STYLES}:MultiHeadAttention").stdout)
    assert kept["passed"] and kept["notes"][-1].startswith("its boolean mask was read as True where a "
                                                           "query may attend (the lecture's convention)")
    plain = json.loads(cli("verify", "--format", "json", "--module", f"{COURSE_STYLES}:MultiHeadAttention").stdout)
    assert not any("boolean mask was read" in n for n in plain["notes"])  # no mask given: nothing to say


def test_a_profile_of_ones_own_and_the_errors_of_a_profile(cli, tmp_path):
    import mha_trace

    own = tmp_path / "mine.toml"
    own.write_text('title = "My course"\nconvention = "True where a query may NOT look"\n'
                   'mask_means = "blocked"\nmask = "causal"\nheads = 2\n')
    data = json.loads(cli("verify", "--module", f"{COURSE_STYLES}:InvertedMask", "--course", str(own),
                          "--format", "json").stdout)
    assert data["passed"] and data["notes"][0] == ("checked under the mine.toml profile (My course): "
                                                   "True where a query may NOT look")
    assert mha_trace.verify(f"{COURSE_STYLES}:MultiHeadAttention", course="cs231n").passed  # the API's
    assert not mha_trace.verify(f"{COURSE_STYLES}:InvertedMask", course="cs231n").passed  # the same profile
    (tmp_path / "bad.toml").write_text('mask_means = "sideways"\n')
    (tmp_path / "key.toml").write_text('masks = "causal"\n')
    for args, message in [
        (("--course", "nosuch"), "Error: --course: 'nosuch' is not a bundled course (cs231n, cs336, d2l, "
                                 "eecs498) or a profile's .toml file\n"),
        (("--course", str(tmp_path / "bad.toml")), "Error: --course: " + str(tmp_path / "bad.toml")
         + ": mask_means is 'keep' or 'blocked'\n"),
        (("--course", str(tmp_path / "key.toml")), "Error: --course: " + str(tmp_path / "key.toml")
         + ": key 'masks' is not one of title, convention, mask_means, mask, d_model, heads, seq, batch\n"),
        (("--course", "cs231n", "--mask-means", "blocked"), "Error: --mask-means blocked contradicts the "
                                                             "cs231n profile's (keep): leave one out\n")]:
        result = cli("verify", "--module", f"{COURSE_STYLES}:MultiHeadAttention", *args)
        assert (result.exit_code, result.stderr) == (2, message)
    alone = cli("verify", "--course", "cs231n")
    assert (alone.exit_code, alone.stderr) == (2, "Error: --course holds a course's conventions for your "
                                                  "module: add --module\n")
    with pytest.raises(mha_trace.MhaError, match="--course holds a course's conventions"):
        mha_trace.verify(course="cs231n")


def test_an_output_named_otherwise_is_the_one_square_weight_left_and_dropout_left_on_is_named(cli):
    """q_proj, k_proj and v_proj named, output_proj not in the list: the one d_model × d_model
    weight left is the output (it tried 24 orders before, and a wrong module failed all of them);
    F.dropout without training= changes the weights in eval mode: named at its line, by what it
    did to the values (once "do not say which projection each is")."""
    right = json.loads(cli("verify", "--module", "tests/student/output_named_otherwise.py:OutputProj",
                           "--format", "json").stdout)
    assert right["passed"] and right["mapping"].startswith("q=q_proj, k=k_proj, v=v_proj, o=output_proj")
    result = cli("verify", "--module", "tests/student/output_named_otherwise.py:DropoutLeftOn", "--format", "json")
    wrong = json.loads(result.stdout)
    assert result.exit_code == 1 and wrong["diagnosis"] == "dropout left on: it drops weights at random even in eval mode"
    assert wrong["first_wrong_step"]["line"] == 32 and "F.dropout" in wrong["first_wrong_step"]["source"]
    assert wrong["fix"].startswith("pass training=self.training to F.dropout")


def test_a_padding_mask_of_one_row_of_keys_per_sequence_is_fed_so(cli):
    """BERT's attention_mask is (B, T), one row of keys a sequence: with padding alone it is fed
    that layout, and the layout is said (a (T, T) mask did not broadcast against it)."""
    data = json.loads(cli("verify", "--module", "tests/student/key_padding.py:BertSelfAttention",
                          "--pad", "2", "--format", "json").stdout)
    assert data["passed"] and data["weights_max_abs_diff"] < 1e-12
    assert "its mask is one row of the keys per sequence, (B, T), as BERT's attention_mask: padding" in data["notes"]


def test_forwards_inputs_are_fed_by_their_names(cli):
    """forward(key, value, query) gets each its own tensor (it was fed by position: refused after
    24 orders); forward(x, cos, sin) is refused in one line (it was fed q, k, v and called Wrong)."""
    data = json.loads(cli("verify", "--module", "tests/student/inputs_by_name.py:KeyValueQuery", "--mask",
                          "causal", "--format", "json").stdout)
    assert data["passed"] and data["call"] == "forward(key, value, query, mask)"
    assert data["mapping"] == "q=linear_query, k=linear_keys, v=linear_values, o=final_linear (by name)"
    rotary = cli("verify", "--module", "tests/student/inputs_by_name.py:Rotary")
    assert (rotary.exit_code, rotary.stderr) == (2, "Error: --module: Rotary.forward takes cos, sin: rotary "
                                                    "positions made outside the module, which verify does not "
                                                    "make for it (give it a forward that makes them, or trace "
                                                    "it with shapes)\n")


@pytest.mark.parametrize("cls,line,named", [
    ("SoftCapped", 39, "logit soft-capping (Gemma 2)"), ("QKNorm", 44, "QK-norm (Qwen3, OLMo 2)"),
    ("PositionBias", 54, "a position bias added to the scores"), ("PartialRope", 75, "partial RoPE (Phi's, GPT-J's)")])
def test_a_variant_is_named_at_its_line_not_called_a_mistake(cli, cls, line, named):
    """QK-norm, soft-capping and a relative position bias make attention other than the lecture's:
    named as a variant at the student's line (once "none of the known mistakes"), exit 1, and a
    student's mistakes are still mistakes (the plain class is Right)."""
    result = cli("verify", "--module", f"tests/student/variants_2026.py:{cls}", "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and data["variant"].startswith(named) and data["diagnosis"] is None
    assert data["first_wrong_step"]["line"] == line
    text = cli("verify", "--module", f"tests/student/variants_2026.py:{cls}").stdout
    assert "Not the lecture's module: a variant (exit code 1)." in text and "Wrong" not in text
    assert json.loads(cli("verify", "--module", "tests/student/variants_2026.py:Base", "--format",
                          "json").stdout)["passed"]


def test_a_sliding_window_is_named_and_right_under_its_flag(cli):
    """A module that masks each query to its last 4 keys by itself: without --window, the variant
    named with the flag that checks it; with --window 4, Right and said so; at another width, Wrong."""
    spec = "tests/student/variants_2026.py:SlidingWindow"
    data = json.loads(cli("verify", "--module", spec, "--format", "json").stdout)
    assert data["variant"].startswith("a sliding window of 4 keys") and "--window 4 checks it" in data["variant"]
    assert data["first_wrong_step"]["line"] == 63
    right = json.loads(cli("verify", "--module", spec, "--window", "4", "--format", "json").stdout)
    assert right["passed"] and "under a sliding window of 4 keys" in " ".join(right["notes"])
    wrong = cli("verify", "--module", spec, "--window", "3", "--format", "json")
    assert wrong.exit_code == 1 and not json.loads(wrong.stdout)["passed"]


def test_init_sets_the_sizes_the_check_runs_at(cli):
    """--init 'num_heads=2, dim_in=16' builds the class 16 wide: the check runs 16 wide with 2 heads
    (it ran at 64 and refused: "q has a weight of shape [16, 16]; as q it should be [64, 64]")."""
    args = ("verify", "--module", f"{COURSE_STYLES}:Eecs498Style", "--init", "num_heads=2, dim_in=16",
            "--mask", "causal", "--mask-means", "blocked", "--format", "json")
    data = json.loads(cli(*args).stdout)
    assert data["passed"] and data["mapping"] == "q=q, k=k, v=v, o=out (by name)"
    import mha_trace

    assert mha_trace.verify(f"{COURSE_STYLES}:Eecs498Style", init="num_heads=2, dim_in=16", mask="causal",
                            mask_means="blocked").passed


def test_two_mistakes_at_once_are_each_named_with_each_fix(cli, tmp_path):
    """No one mistake gives the output, two together do: both are named, the first at its line,
    and the fix says each in turn."""
    skeleton = (pathlib.Path(__file__).parent / "classroom" / "skeleton.py").read_text()
    (tmp_path / "two.py").write_text(skeleton.replace("/ math.sqrt(D)", "/ D").replace("dim=-1", "dim=-2"))
    data = json.loads(cli("verify", "--module", f"{tmp_path / 'two.py'}:MultiHeadAttention", "--course", "cs231n",
                          "--format", "json").stdout)
    assert data["diagnosis"] == "scaled by d_k instead of √d_k; and softmax over the queries instead of the keys"
    assert data["first_wrong_step"]["line"] == next(i for i, line in enumerate(skeleton.splitlines(), 1)
                                                     if "/ math.sqrt(D)" in line)
    assert data["fix"].startswith("divide the scores by math.sqrt(d_k), not by d_k; then take the softmax over the keys")


@pytest.mark.parametrize("wrong, reading", [
    ("/ math.sqrt(D) * 3", "its numbers are the lecture's times 3"),
    ("/ math.sqrt(D) * -1", "its numbers are the lecture's times -1"),
])
def test_a_mistake_no_known_one_gives_is_read_at_its_step(cli, tmp_path, wrong, reading):
    """No known mistake, nor two of them, gives the output: what the first wrong step's numbers
    are beside the lecture's is said, read from the numbers whatever the code's shape."""
    skeleton = (pathlib.Path(__file__).parent / "classroom" / "skeleton.py").read_text()
    (tmp_path / "odd.py").write_text(skeleton.replace("/ math.sqrt(D)", wrong))
    result = cli("verify", "--module", f"{tmp_path / 'odd.py'}:MultiHeadAttention", "--d-model", "32", "--heads", "4",
                 "--format", "json")
    data = json.loads(result.stdout)
    assert result.exit_code == 1 and data["diagnosis"] is None and data["reading"] == reading


def test_two_mistakes_are_found_on_the_stages_one_mistake_computed(monkeypatch):
    """The search for two mistakes at once reads each stage one mistake alone computed and keeps
    nothing of its own (hundreds of score tensors at a lecture's sizes): the memo is no larger
    after the pairs than after the single mistakes, and the pair found is the one NumPy computes
    by hand (scores ÷ d_k, the softmax over the queries)."""
    import numpy as np
    import torch

    from mha_trace.analyses import diagnosis
    from mha_trace.core.attention import MultiHeadAttention

    torch.manual_seed(0)
    m = MultiHeadAttention(d_model=16, heads=2).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    w = {name: getattr(m, name).weight.detach().numpy() for name in ("W_q", "W_k", "W_v", "W_o")}
    b = {name: getattr(m, name).bias.detach().numpy() for name in ("W_q", "W_k", "W_v", "W_o")}
    split = lambda t: t.reshape(2, 5, 2, 8).transpose(0, 2, 1, 3)
    q, k, v = (split(x.numpy() @ w[n].T + b[n]) for n in ("W_q", "W_k", "W_v"))
    s = q @ k.transpose(0, 1, 3, 2) / 8
    weights = np.exp(s - s.max(axis=-2, keepdims=True))
    weights /= weights.sum(axis=-2, keepdims=True)  # over the queries
    out = (weights @ v).transpose(0, 2, 1, 3).reshape(2, 5, 16) @ w["W_o"].T + b["W_o"]
    kept, matching = [], diagnosis._matching
    monkeypatch.setattr(diagnosis, "_matching", lambda *a: (matching(*a), kept.append(len(a[-1].found)))[0])
    assert diagnosis.diagnoses(m, x, None, torch.from_numpy(out)) == [
        "scaled by d_k instead of √d_k; and softmax over the queries instead of the keys"]
    assert len(kept) == 2 and kept[0] == kept[1] > 0
