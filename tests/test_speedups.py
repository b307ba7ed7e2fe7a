"""The start-up speed-ups live in one module behind one switch, and change no printed byte."""

import os
import pathlib
import subprocess
import sys

import pytest

COMMANDS = [  # the plain `shapes` table is in the rope case too
    ("heads", "--model", "minilm", "--head", "1.3"),
    ("shapes", "--heads", "x"),  # an error line, through the option coercion
    ("shapes", "--rope", "--rope-base", "500", "--seq", "4", "--device", "meta"),  # a float option; meta
    ("shapes", "--rope", "--rope-base", "x"),
]


def run(args, speedups: bool):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "MHA_TRACE_NO_SPEEDUPS")}
    if not speedups:
        env["MHA_TRACE_NO_SPEEDUPS"] = "1"
    return subprocess.run([sys.executable, "-m", "mha_trace", *args], capture_output=True,
                          text=True, env=env, timeout=300)


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_the_same_output_with_and_without_the_speedups(args):
    fast, plain = run(args, True), run(args, False)
    assert (fast.returncode, fast.stdout) == (plain.returncode, plain.stdout)
    assert fast.stdout or fast.stderr.startswith("Error:")
    if args[-1] == "x":  # typer's own coercion words it differently: still one Error line
        assert plain.stderr.startswith("Error:") and plain.stderr.count("\n") == 1
        assert fast.stderr.startswith("Error:") and "'x'" in fast.stderr
    else:
        assert fast.stderr == plain.stderr


def test_the_switch_turns_every_speedup_off():
    code = ("import gc, sys, mha_trace.cli; from mha_trace import speedups; "
            "import typer.core as c; "
            "speedups.no_garbage_collection(); "
            "print(speedups.ENABLED, gc.isenabled(), "
            "c._TyperParameter.get_runtime_param.__module__)")
    for flag, expected in (("1", "False True typer.core"), ("", "True False mha_trace.speedups")):
        env = {**os.environ, "MHA_TRACE_NO_SPEEDUPS": flag}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert out.stdout.split() == expected.split(), out.stderr


def test_tricks_live_in_one_module():
    package = pathlib.Path(__file__).parent.parent / "mha_trace"
    tricks = ("mallopt", "gc.disable", "os._exit(code)", "sys.modules.update",
              "set_num_threads(1)")
    found = {(p.name, t) for p in package.rglob("*.py") for t in tricks if t in p.read_text()}
    # runtime.one_thread is for determinism (verify's sums in one order), not speed
    assert found == {("speedups.py", t) for t in tricks} | {("runtime.py", "set_num_threads(1)")}


def test_training_never_imports_dynamo_and_trains_the_same():
    """The optimiser's "do not compile" marks cost an import of torch._dynamo (about 1 s); with
    the speed-ups training never imports it, and every loss is the same to the last bit."""
    code = ("import sys; from mha_trace.models.training import Spec, run_training; "
            "r = run_training(Spec.of('previous-token', steps=12, snapshots=2)); "
            "print('torch._dynamo' in sys.modules, r.losses)")
    env = {k: v for k, v in os.environ.items() if k != "MHA_TRACE_NO_SPEEDUPS"}
    fast = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**env, "MHA_TRACE_NO_SPEEDUPS": "1"}, timeout=300)
    assert fast.stdout.startswith("False ") and plain.stdout.startswith("True "), fast.stderr
    assert fast.stdout.split(" ", 1)[1] == plain.stdout.split(" ", 1)[1]
