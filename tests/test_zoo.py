"""The zoo of real bugs (tests/student/zoo.py): each module is Wrong, the mistake is named with
its one-sentence fix, and the line named is the one that did the wrong job."""

import json

import pytest

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent / "student"))
from zoo import ZOO, module  # noqa: E402 (the zoo's folder is on the path)


def marked_line(source: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if "# <- the mistake" in line)


@pytest.mark.parametrize("name", ZOO)
def test_each_bug_is_wrong_named_and_found_at_its_line(cli, tmp_path, name):
    entry = ZOO[name]
    source = module(entry)
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    result = cli("verify", "--module", f"{path}:Attention", *entry.args, "--format", "json")
    assert result.exit_code == 1, result.stdout + result.stderr
    data = json.loads(result.stdout)
    assert data["diagnosis"] == entry.mistake
    assert data["fix"]
    step = data["first_wrong_step"]
    assert step is not None, data
    assert marked_line(source) in (step["line"], step["called_from"]), (step, source)


def test_the_zoo_holds_every_known_mistake_each_with_a_fix():
    from mha_trace.analyses.mistakes import FIXES, MISTAKES

    assert len(MISTAKES) >= 30 and {e.mistake for e in ZOO.values()} == {m.name for m in MISTAKES}
    assert all(fix.strip() for fix in FIXES.values())  # the variants' own zoo: tests/test_scoring.py


LINES = {  # the student's own line, through a fused projection, a helper, a NumPy loop over heads
    "fused_split.py:Fused": ((), "softmax over the queries instead of the keys"),
    "rope_helper.py:Rotary": (("--rope",), "RoPE applied to V too"),
    "numpy_loop.py:LoopMHA": ((), "softmax over the queries instead of the keys"),
}


@pytest.mark.parametrize("spec", LINES)
def test_the_line_named_is_the_students_own(cli, spec):
    """A fused qkv(x).split(...) whose parts are right is passed over; a helper's step is named
    with the line in forward that called it; a NumPy loop's slice of V is not the softmax."""
    args, mistake = LINES[spec]
    path = pathlib.Path(__file__).parent / "student" / "lines" / spec.split(":")[0]
    data = json.loads(cli("verify", "--module", f"{path}:{spec.split(':')[1]}", *args,
                          "--format", "json").stdout)
    assert data["diagnosis"] == mistake
    step = data["first_wrong_step"]
    assert marked_line(path.read_text()) in (step["line"], step["called_from"]), step


EXPOSED = {  # right at the sizes given, wrong at the ones verify also tries
    "merge_seq_first": (("--batch", "1"), "a batch of 3"),
    "merge_no_transpose": (("--heads", "1"), "2 heads"),
}


@pytest.mark.parametrize("name", EXPOSED)
def test_verify_varies_the_sizes_until_the_mistake_shows(cli, tmp_path, name):
    args, exposed_by = EXPOSED[name]
    path = tmp_path / f"{name}.py"
    path.write_text(module(ZOO[name]))
    data = json.loads(cli("verify", "--module", f"{path}:Attention", *args, "--format", "json").stdout)
    assert not data["passed"] and data["diagnosis"] == ZOO[name].mistake
    assert any(f"but not with {exposed_by}" in n for n in data["notes"]), data["notes"]


def test_a_view_of_a_non_contiguous_input_is_found_and_said_but_is_not_a_mistake(cli, tmp_path):
    """x.view(...) runs on a contiguous input and raises on a transposed one: verify feeds both
    and says so, naming the line (fairseq issue #2598: "view size is not compatible with input
    tensor's size and stride"). It never computes a wrong number, and a model feeds it a
    LayerNorm's contiguous output (Hugging Face GPT-2's Conv1D is written so): Right, with the
    caveat."""
    from zoo import Entry

    path = tmp_path / "view_x.py"
    source = module(Entry("", {"q": "self.W_q(x.view(B * T, -1)).view(B, T, self.h, self.d_k)"
                                    ".transpose(1, 2)"}, "q"))
    path.write_text(source)
    result = cli("verify", "--module", f"{path}:Attention", "--format", "json")
    assert result.exit_code == 0, result.stderr
    note = next(n for n in json.loads(result.stdout)["notes"] if n.startswith("it needs a contiguous"))
    line = next(i for i, text in enumerate(source.splitlines(), 1) if "x.view(B * T" in text)
    assert f"view_x.py:{line} (" in note and ".reshape() or .contiguous()" in note


@pytest.mark.parametrize("sizes", [("--d-model", "32", "--heads", "4"), ("--d-model", "48", "--heads", "6")])
@pytest.mark.parametrize("style", list(__import__("zoo").CORRECT))
def test_correct_styles_are_right_at_two_sizes(cli, tmp_path, style, sizes):
    from zoo import correct_module

    path = tmp_path / "mine.py"
    path.write_text(correct_module(style))
    result = cli("verify", "--module", f"{path}:Attention", *sizes, "--mask", "causal",
                 "--format", "json")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["output_max_abs_diff"] < 1e-10


def test_the_previews_show_the_values_around_the_first_difference(cli, tmp_path):
    """For a merge mistake the first values are equal on both sides: the previews start one
    before the first difference, so the two lines differ where it matters."""
    path = tmp_path / "merge.py"
    path.write_text(module(ZOO["merge_no_transpose"]))
    text = cli("verify", "--module", f"{path}:Attention").stdout
    yours = next(line for line in text.splitlines() if line.startswith("  yours:"))
    theirs = next(line for line in text.splitlines() if line.startswith("  the lecture's:"))
    first = lambda line: line.split("[…, ")[1].split(",")[:2]
    assert first(yours)[0] == first(theirs)[0] and first(yours)[1] != first(theirs)[1]


def test_the_readme_and_the_guide_count_the_mistakes_the_code_knows():
    from mha_trace.analyses.mistakes import MISTAKES

    root = pathlib.Path(__file__).parent.parent
    readme = " ".join((root / "README.md").read_text().split())
    guide = " ".join((root / "docs" / "verify.md").read_text().split())
    assert f"a diagnosis among {len(MISTAKES)} classic mistakes" in readme
    assert f"each of {len(MISTAKES)} known mistakes" in guide
