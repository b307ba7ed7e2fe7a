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


def test_the_zoo_holds_thirty_mistakes_each_with_a_fix():
    from mha_trace.analyses.mistakes import FIXES

    assert len(ZOO) >= 30 and len({e.mistake for e in ZOO.values()}) >= 30
    assert {e.mistake for e in ZOO.values()} <= set(FIXES)


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
