"""verify --module: a student's own class against the lecture's module, and what went wrong."""

import json

import pytest

S = "tests/student/student_bugs.py:"


@pytest.mark.parametrize("spec,args", [
    ("tests/student/correct_renamed.py:Attention", ("--mask", "causal")),  # other names, permute
    ("tests/student/fused_qkv.py:FusedAttention", ()),  # one fused projection, no weights returned
    ("torch.nn:MultiheadAttention", ("--mask", "causal")),
    ("example:l04", ()), ("example:committee", ("--mask", "causal")), ("example:raschka", ()),
    ("example:reference_sheet", ()), (S + "Correct", ("--mask", "causal")),
])
def test_correct_modules_pass(cli, spec, args):
    result = cli("verify", "--module", spec, "--d-model", "32", "--heads", "4", *args, "--format", "json")
    assert result.exit_code == 0, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["passed"] and data["output_max_abs_diff"] < 1e-10


@pytest.mark.parametrize("cls,args,diagnosis,line", [
    ("ScaledByDk", (), "scaled by d_k instead of √d_k", 26),
    ("NotScaled", (), "not scaled at all", 32),
    ("WrongAxis", (), "softmax over the wrong axis", 32),
    ("MergedWithoutTranspose", (), "heads merged without transposing back", 21),
    ("MaskInverted", ("--mask", "causal"), "mask inverted", 31),
    ("MaskOffByOne", ("--mask", "causal"), "mask off by one (a query sees one key ahead)", 31),
    ("KNotTransposed", ("--seq", "8"), "K not transposed", 25),
    ("NoWO", (), "W_O missing", None),
    ("NoBias", (), "bias missing", 21),
])
def test_each_bug_is_caught_and_named(cli, cls, args, diagnosis, line):
    result = cli("verify", "--module", S + cls, "--d-model", "32", "--heads", "4", *args,
                 "--format", "json")
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert not data["passed"] and data["diagnosis"] == diagnosis
    wrong = data["first_wrong_step"]
    assert (wrong["line"] if wrong else None) == line


def test_a_causal_module_checked_without_a_mask_is_told_so(cli):
    data = json.loads(cli("verify", "--module", "example:nanogpt", "--d-model", "32", "--heads", "4",
                          "--format", "json").stdout)
    assert data["diagnosis"] == "a causal mask of its own, though none was asked for"


def test_the_mapping_is_printed_and_can_be_given(cli, tmp_path):
    out = cli("verify", "--module", "example:l04", "--d-model", "32", "--heads", "4").stdout
    assert "Projections found by name: q=W_q, k=W_k, v=W_v, o=W_o; called as forward(q, k, v)." in out
    odd = tmp_path / "odd.py"
    odd.write_text(open("tests/student/correct_renamed.py").read().replace("self.query", "self.a")
                   .replace("self.key", "self.b").replace("self.value", "self.c").replace("self.out", "self.d"))
    data = json.loads(cli("verify", "--module", f"{odd}:Attention", "--d-model", "32", "--heads", "4",
                          "--format", "json").stdout)
    assert data["passed"] and data["mapping"].endswith("(by shape, in the order defined)")
    given = json.loads(cli("verify", "--module", f"{odd}:Attention", "--d-model", "32", "--heads", "4",
                           "--map", "q=a,k=b,v=c,o=d", "--format", "json").stdout)
    assert given["passed"] and given["mapping"] == "q=a, k=b, v=c, o=d (--map)"
    bad = cli("verify", "--module", f"{odd}:Attention", "--map", "q=zz")
    assert bad.exit_code == 2 and bad.stderr.startswith("Error: --map: 'q=zz' is not ROLE=LAYER")


def test_the_first_wrong_step_shows_both_sides(cli):
    out = cli("verify", "--module", S + "ScaledByDk", "--d-model", "32", "--heads", "4").stdout
    assert "First wrong step: tests/student/student_bugs.py:26" in out
    assert "  yours: div [2, 4, 6, 6]" in out and "  the lecture's: div [2, 4, 6, 6]" in out


@pytest.mark.parametrize("command", ["compare", "ablate"])
def test_compare_and_ablate_say_why_not_with_a_module(cli, command):
    result = cli(command, "--module", "example:l04")
    assert result.exit_code == 2 and result.stderr.startswith("Error: --module: ")
    assert "lecture's module" in result.stderr
