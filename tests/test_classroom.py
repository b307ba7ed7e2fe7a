"""A whole class at once (`verify --module FOLDER:Name`): a class built from one CS231n-style
skeleton (tests/classroom/skeleton.py), each student changing one line (a classic mistake) or adding
a few (a hostile submission: it loops, allocates 50 GB, deletes and writes the lecturer's files, reads
a secret, connects to a listening socket, starts a process, crashes, exits, does not parse). The
class runs as a lecturer runs it, in a process of its own, and the test checks every verdict, the
line and the mistake, that nothing outside was touched, and the four gradebook files."""

import csv
import io
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts a process that forks one per student

SKELETON = (Path(__file__).parent / "classroom" / "skeleton.py").read_text()
LINES = SKELETON.splitlines()
SECRET = "the lecturer's answer key: 42"
AT_IMPORT = "from torch.nn import functional as F\n"  # hostile code goes after this line

MISTAKES = {  # student: (the line as the skeleton has it, as the student wrote it, the mistake named)
    "bob": ("/ math.sqrt(D)", "/ D", "scaled by d_k instead of √d_k"),
    "carol": ("/ math.sqrt(D)", "/ D", "scaled by d_k instead of √d_k"),
    "dan": ("attn_mask == 0", "attn_mask == 1", "mask inverted"),
    "erin": ("dim=-1", "dim=-2", "softmax over the queries instead of the keys"),
    "frank": ("(attn @ v).transpose(1, 2).reshape", "(attn @ v).reshape", "heads merged without transposing back"),
}
HOSTILE = {  # student: (code added at import, its verdict, words its row must hold)
    "looper": ("while True:\n    pass\n", "stopped", "time limit"),
    "hog": ("hoard = torch.ones(50 * 2**30 // 8, dtype=torch.float64)\n", "stopped", "memory limit"),
    "deleter": ("import os\nfor victim in ({canary!r}, {alice!r}):\n    try:\n        os.remove(victim)\n"
                "    except OSError:\n        pass\n", "right", "deleted or moved {canary}"),
    "forger": ("open({forged!r}, 'w').write('forger,right')\n", "refused", "wrote {forged}"),
    "reader": ("try:\n    secret = open({canary!r}).read()\nexcept OSError:\n    secret = 'unread'\n"
               "print('the secret is', secret)\n", "right", "read {canary}"),
    "caller": ("import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n"
               "except OSError:\n    pass\n", "right", "connected a socket to ('127.0.0.1', {port})"),
    "spawner": ("import subprocess\nsubprocess.Popen(['sleep', '301.5'], start_new_session=True)\n", "right",
                "started a process"),
    "crasher": ("import ctypes\nctypes.string_at(0)\n", "stopped", "segmentation fault"),
    "quitter": ("import sys\nsys.exit(3)\n", "refused", "sys.exit(3)"),
}


def build(root: Path, port: int) -> dict:
    """The class folder (and, beside it, the lecturer's files a hostile student goes for)."""
    klass = root / "class"
    klass.mkdir()
    paths = {"canary": str(root / "answers.txt"), "alice": str(klass / "alice.py"),
             "forged": str(root / "grades-forged.csv"), "port": port}
    Path(paths["canary"]).write_text(SECRET)
    for name in ("alice", "grace"):
        (klass / f"{name}.py").write_text(SKELETON)
    for name, (line, wrong, _) in MISTAKES.items():
        (klass / f"{name}.py").write_text(SKELETON.replace(line, wrong))
    for name, (code, _, _) in HOSTILE.items():
        (klass / f"{name}.py").write_text(SKELETON.replace(AT_IMPORT, AT_IMPORT + code.format(**paths)))
    (klass / "broken.py").write_text(SKELETON.replace("def forward(self, query,", "def forward(self, query"))
    (klass / "utils.py").write_text("HELPER = 1\n")  # defines no class: skipped
    return paths


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The class run once, as a lecturer runs it: (the text printed, the gradebook's JSON, the
    folders, the listener's connections, the lecturer's folder before and after). That the JSON
    printed is the gradebook's is test_a_class_from_a_process_that_ran_torch_and_from_the_api's."""
    root = tmp_path_factory.mktemp("course")
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    paths = build(root, listener.getsockname()[1])
    lecturer = root / "lecturer"
    lecturer.mkdir()
    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    args = [sys.executable, "-m", "mha_trace", "verify", "--module", f"{root / 'class'}:MultiHeadAttention",
            "--course", "cs231n", "--time-limit", "4", "--memory", "1", "--jobs", "2"]
    env = dict(os.environ, COLUMNS="100", TMPDIR=str(root / "tmp"))
    (root / "tmp").mkdir()
    run = subprocess.run(args + ["--gradebook", str(root / "grades")], cwd=lecturer, capture_output=True,
                         text=True, env=env, timeout=300)
    try:
        listener.accept()
        connected = True
    except BlockingIOError:
        connected = False
    listener.close()
    strict = lambda text: json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    data = strict((root / "grades" / "grades.json").read_text()) if run.returncode == 0 else None
    return {"run": run, "data": data, "root": root, "paths": paths, "before": before, "connected": connected}


def rows(graded) -> dict:
    return {r["student"]: r for r in graded["data"]["students"]}


def test_every_mistake_is_wrong_at_its_line_and_named(graded):
    assert graded["run"].returncode == 0, graded["run"].stderr
    found = rows(graded)
    for name, (line, _, mistake) in MISTAKES.items():
        at = next(i for i, text in enumerate(LINES, 1) if line in text)
        assert (found[name]["verdict"], found[name]["line"], found[name]["mistake"]) == ("wrong", at, mistake), name
        assert found[name]["fix"]
    assert found["alice"]["verdict"] == found["grace"]["verdict"] == "right"
    assert found["broken"]["verdict"] == "refused" and "SyntaxError" in found["broken"]["message"]
    assert "utils.py" in graded["data"]["skipped"] and "utils" not in found


def test_the_class_mistakes_are_counted(graded):
    counts = {c["outcome"]: c["students"] for c in graded["data"]["counts"]}
    assert counts["scaled by d_k instead of √d_k"] == 2
    n = len(graded["data"]["students"])
    assert n == 2 + len(MISTAKES) + len(HOSTILE) + 1
    assert graded["data"]["right"] == sum(r["verdict"] == "right" for r in graded["data"]["students"])
    text = graded["run"].stdout
    assert f"Scaled by d_k instead of √d_k: 2 of {n}." in text and f"Right: {graded['data']['right']} of {n}." in text
    assert graded["run"].returncode == 0 and "Traceback" not in graded["run"].stderr


def test_each_hostile_submission_is_stopped_or_contained_and_reported(graded):
    found, paths = rows(graded), graded["paths"]
    for name, (_, verdict, words) in HOSTILE.items():
        row = found[name]
        said = " ".join([row["message"] or "", *row.get("attempts", [])])
        assert row["verdict"] == verdict and words.format(**paths) in said, (name, row)


def test_nothing_outside_a_submissions_scratch_folder_is_touched(graded):
    root, held = graded["root"], graded["data"]["contained"]
    assert not list((root / "tmp").iterdir())  # each submission's scratch folder is gone
    if "not contained" in held["files"] or "not cut off" in held["network"]:  # a kernel without them
        assert "not contained" in rows(graded)["forger"]["contained"]["files"]  # said, not claimed
        return
    after = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and "grades" not in p.parts[-2]}
    assert after == graded["before"]  # the secret, alice's file, the lecturer's folder: as they were
    assert not Path(graded["paths"]["forged"]).exists()
    assert not graded["connected"]  # the caller never reached the listener
    assert SECRET not in graded["run"].stdout + graded["run"].stderr
    assert "the secret is unread" in rows(graded)["reader"]["printed"]
    assert not [p for p in Path("/proc").glob("[0-9]*") if _cmdline(p) == "sleep 301.5"]


def _cmdline(p: Path) -> str:
    try:
        return p.joinpath("cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def test_the_gradebook_files(graded):
    folder, data = graded["root"] / "grades", graded["data"]
    strict = lambda text: json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    table = list(csv.DictReader(io.StringIO((folder / "grades.csv").read_text())))
    assert [r["student"] for r in table] == [r["student"] for r in data["students"]]
    assert {r["student"]: r["verdict"] for r in table} == {r["student"]: r["verdict"] for r in data["students"]}
    gradescope = strict((folder / "results.json").read_text())
    assert gradescope["score"] == data["right"] and len(gradescope["tests"]) == len(data["students"])
    for test, row in zip(gradescope["tests"], data["students"]):
        assert (test["name"], test["max_score"], test["status"]) == (
            row["student"], 1, "passed" if row["verdict"] == "right" else "failed")
        if row["mistake"]:
            assert row["mistake"] in test["output"]
    page = (folder / "grades.html").read_text()
    assert "<script" not in page and "scaled by d_k instead of √d_k" in page


def test_a_spreadsheet_never_runs_a_students_text_as_a_formula(tmp_path):
    from mha_trace.io.gradebook import _csv

    data = {"students": [{"student": "=HYPERLINK(\"http://x\")", "verdict": "right", "line": None,
                          "mistake": "-1+1", "fix": None, "message": "@SUM(A1)", "output_max_abs_diff": -0.5,
                          "file": "x.py", "attempts": []}]}
    row = next(csv.DictReader(io.StringIO(_csv(data))))
    assert row["student"].startswith("'=") and row["mistake"] == "'-1+1" and row["message"] == "'@SUM(A1)"
    assert row["output_max_abs_diff"] == "-0.5"  # a number stays a number


def test_a_class_from_a_process_that_ran_torch_and_from_the_api(tmp_path, cli):
    """Forked from a process that has run torch (a notebook's kernel, this test), each submission
    still runs; the API returns the same gradebook the command line prints."""
    import torch

    import mha_trace

    torch.randn(64, 64) @ torch.randn(64, 64)  # torch's thread pool is up in this process
    for name, text in (("ok", SKELETON), ("bob", SKELETON.replace(*MISTAKES["bob"][:2]))):
        (tmp_path / f"{name}.py").write_text(text)
    spec = f"{tmp_path}/*.py:MultiHeadAttention"
    book = mha_trace.verify(spec, course="cs231n", jobs=2)
    assert [(r["student"], r["verdict"]) for r in book.rows] == [("bob", "wrong"), ("ok", "right")]
    result = cli("verify", "--module", spec, "--course", "cs231n", "--format", "json", "--gradebook", str(tmp_path / "g"))
    assert result.exit_code == 0 and json.loads(result.stdout)["students"] == book.data()["students"]
    assert json.loads((tmp_path / "g" / "grades.json").read_text()) == json.loads(result.stdout)  # as printed


@pytest.mark.parametrize("args, words", [
    (["--module", "example:l04", "--jobs", "2"], "--jobs, --time-limit and --memory go with a class"),
    (["--gradebook", "g"], "--gradebook holds a class's verdicts: add --module"),
    (["--module", "nowhere/*.py:X"], "no file matches nowhere/*.py"),
    (["--module", "{tmp}:Missing"], "defines class Missing"),
    (["--module", "{tmp}/*.py:X", "--device", "cuda"], "a class is verified on the CPU"),
    (["--module", "{tmp}/*.py:X", "--jobs", "0"], "--jobs"),
    (["--module", "{tmp}/*.py:X", "--gradebook", "{tmp}/a.py"], "a.py is a file; give a folder, e.g. grades/"),
    (["--module", "{tmp}/*.py:X", "--gradebook", "{tmp}/no/such/grades"], "is not a folder"),
])
def test_a_class_refused_in_one_line(cli, tmp_path, args, words):
    (tmp_path / "a.py").write_text("A = 1\n")
    result = cli("verify", *[a.format(tmp=tmp_path) for a in args])
    assert result.exit_code == 2 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("option, value", [("jobs", 0), ("jobs", 2.5), ("time_limit", -1), ("memory", "4")])
def test_the_apis_limits_are_checked(tmp_path, option, value):
    import mha_trace
    from mha_trace.errors import MhaError

    (tmp_path / "a.py").write_text(SKELETON)
    with pytest.raises(MhaError, match=option):
        mha_trace.verify(f"{tmp_path}/*.py:MultiHeadAttention", **{option: value})


def _book():
    from mha_trace.analyses.gradebook import Gradebook, row

    held = {"memory": "4 GiB", "network": "none (a network namespace of its own)",
            "files": "written only in its scratch folder; read only from the system's and Python's folders "
                     "and its own file (Landlock)"}
    scaled = {"first_wrong_step": {"line": 30, "source": "scores = q @ k.transpose(-2, -1) / D"},
              "diagnosis": "scaled by d_k instead of √d_k", "fix": "divide the scores by math.sqrt(d_k), not by d_k",
              "output_max_abs_diff": 0.0348}
    rows = [row("alice", "alice.py", "right", {"output_max_abs_diff": 0.0}),
            row("bob", "bob.py", "wrong", scaled), row("carol-with-a-long-folder/attention", "x.py", "wrong", scaled),
            row("deleter", "deleter.py", "right", {}) | {"attempts": ["deleted or moved /home/lecturer/answers.txt"]},
            row("hog", "hog.py", "stopped", message="over its memory limit (4 GiB): module hog.py: importing it "
                "raised RuntimeError: DefaultCPUAllocator: can't allocate memory"),
            row("looper", "looper.py", "stopped", message="at its time limit: still running after 30 s")]
    return Gradebook("MultiHeadAttention", [r | {"contained": held} for r in rows], "cs231n",
                     "30 s and 4 GiB each", ["utils.py"])


@pytest.mark.parametrize("width", [80, 100, 120])
def test_the_gradebook_reads_at_each_width(golden, width):
    from rich.console import Console

    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(_book())
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= width
    assert "Scaled by d_k instead of √d_k: 2 of 6." in " ".join(text.split())
    golden(f"verify_class_{width}.txt", text)


def test_ctrl_c_ends_every_submissions_process_and_its_scratch(tmp_path):
    """Interrupted while a submission loops: one line, exit 130, and no process or scratch left."""
    import signal
    import time

    (tmp_path / "class").mkdir()
    (tmp_path / "class" / "looper.py").write_text(SKELETON.replace(AT_IMPORT, AT_IMPORT + "while True:\n    pass\n"))
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    run = subprocess.Popen([sys.executable, "-m", "mha_trace", "verify", "--module",
                            f"{tmp_path / 'class'}:MultiHeadAttention", "--time-limit", "600"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 60
    while not list((tmp_path / "tmp").glob("mha-trace-class-*/scratch-0")) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the submission is looping now
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130 and "Traceback" not in err, err
    assert not list((tmp_path / "tmp").iterdir())
    assert not [p for p in Path("/proc").glob("[0-9]*") if str(tmp_path) in _cmdline(p)]
