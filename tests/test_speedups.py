"""The start-up speed-ups live in one module behind one switch, and change no printed byte."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

COMMANDS = [  # the plain `shapes` table is in the rope case too
    ("heads", "--model", "minilm", "--head", "1.3"),
    ("shapes", "--heads", "x"),  # an error line, through the option coercion
    ("shapes", "--rope", "--rope-base", "500", "--seq", "4", "--device", "meta"),  # a float option; meta
    ("shapes", "--rope", "--rope-base", "x"),
]


def run(args):
    """`mha-trace ARGS` as a user runs it, with every speed-up (the fast exit included); the
    modules it imported (`python -X importtime`) are taken out of its stderr into `imported`."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "MHA_TRACE_NO_SPEEDUPS")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "mha_trace", *args],
                          capture_output=True, text=True, env=env, timeout=300)
    lines = done.stderr.splitlines(keepends=True)
    done.imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:")}
    done.stderr = "".join(line for line in lines if not line.startswith("import time:"))
    return done


TRAINING = ("import sys; from mha_trace.models.training import Spec, run_training; "
            "meta = 'torch._meta_registrations' in sys.modules; "
            "losses = run_training(Spec.of('previous-token', steps=12, snapshots=2)).losses; "
            "dynamo = 'torch._dynamo' in sys.modules; ")


@pytest.fixture(scope="module")
def without_speedups():
    """One process with every speed-up off: the training run first (it must import dynamo
    there), then each command through the CLI's own entry, as `python -m mha_trace` would run
    it; one process, so that the slow imports the speed-ups avoid (dynamo, sympy) are paid once."""
    code = TRAINING + (
        "import json; from typer.testing import CliRunner; from mha_trace.cli import app; "
        f"runs = [CliRunner().invoke(app, list(a)) for a in {COMMANDS!r}]; "
        "print(json.dumps({'dynamo': dynamo, 'losses': losses, "
        "'runs': [[r.exit_code, r.stdout, r.stderr] for r in runs]}))")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         env={**env, "MHA_TRACE_NO_SPEEDUPS": "1"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_the_same_output_with_and_without_the_speedups(args, without_speedups):
    """The same bytes either way. The command line imports torch without its Python meta kernels
    (0.15 s): MiniLM's forward never loads them, a forward on meta loads them first."""
    fast = run(args)
    code, stdout, stderr = without_speedups["runs"][COMMANDS.index(args)]
    assert (fast.returncode, fast.stdout) == (code, stdout)
    if fast.returncode == 0:
        assert ("torch._meta_registrations" in fast.imported) == ("meta" in args)
    assert fast.stdout or fast.stderr.startswith("Error:")
    if args[-1] == "x":  # typer's own coercion words it differently: still one Error line
        assert stderr.startswith("Error:") and stderr.count("\n") == 1
        assert fast.stderr.startswith("Error:") and "'x'" in fast.stderr
    else:
        assert fast.stderr == stderr


def test_the_switch_turns_every_speedup_off():
    code = ("import gc, sys, mha_trace.cli; from mha_trace import speedups; "
            "import typer.core as c; "
            "speedups.no_garbage_collection(); "
            "print(speedups.ENABLED, gc.isenabled(), "
            "c._TyperParameter.get_runtime_param.__module__)")
    for flag, expected in (("1", "False True typer.core"), ("", "True False mha_trace.cli.coercion")):
        env = {**os.environ, "MHA_TRACE_NO_SPEEDUPS": flag}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
        assert out.stdout.split() == expected.split(), out.stderr


def test_tricks_live_in_one_module_and_the_coercion_beside_the_command_line():
    package = pathlib.Path(__file__).parent.parent / "mha_trace"
    tricks = ("mallopt", "gc.disable", "os._exit(code)", "sys.modules.update",
              "set_num_threads(1)", "_update_set_signature_and_docstring =")
    typer_trick = "_TyperParameter.get_runtime_param ="  # the command line's own, beside it
    found = {(p.name, t) for p in package.rglob("*.py") for t in (*tricks, typer_trick)
             if t in p.read_text()}
    # runtime.one_thread is for determinism (verify's sums in one order), not speed; __main__'s
    # os._exit ends a run that a signal stopped while it was still importing (not for speed)
    assert found == {("speedups.py", t) for t in tricks} | {("runtime.py", "set_num_threads(1)"),
                                                           ("__main__.py", "os._exit(code)"),
                                                           ("coercion.py", typer_trick)}


def test_training_never_imports_dynamo_and_trains_the_same(without_speedups):
    """The optimiser's "do not compile" marks cost an import of torch._dynamo (about 1 s); with
    the speed-ups training never imports it, and every loss is the same to the last bit. A
    library import of torch (here, or a notebook's) keeps its meta kernels: only the command
    line's process leaves them for later."""
    env = {k: v for k, v in os.environ.items() if k != "MHA_TRACE_NO_SPEEDUPS"}
    code = TRAINING + "import json; print(json.dumps([dynamo, losses, meta]))"
    fast = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=300)
    assert json.loads(fast.stdout) == [False, without_speedups["losses"], True], fast.stderr
    assert without_speedups["dynamo"]


@pytest.mark.parametrize("release, stood_in", [("checked", True), ("2.12.1", False), (None, False)])
def test_meta_kernels_wait_only_for_the_torch_release_checked(release, stood_in, tmp_path, monkeypatch):
    """Another torch release may tie more to its meta kernels than torch.Generator does: its
    import is left as it is (so is one whose version cannot be read)."""
    from importlib.machinery import ModuleSpec

    from mha_trace import speedups

    if release == "checked":
        release = speedups.TORCH_CHECKED + "0+cpu"
    if release:
        (tmp_path / "version.py").write_text(f"__version__ = '{release}'\ndebug = False\n")
    spec = ModuleSpec("torch", None, origin=str(tmp_path / "__init__.py"))
    monkeypatch.delitem(sys.modules, "torch._meta_registrations", raising=False)
    with speedups.meta_kernels_later(spec):
        placed = sys.modules.get("torch._meta_registrations")
        assert getattr(placed, "__stand_in__", False) is stood_in
    assert "torch._meta_registrations" not in sys.modules  # the real one loads on its next import


SET_DOCS = ("import inspect, sys; import numpy as np; from mha_trace import speedups; "
            "from mha_trace.render import heatmaps; "
            "[speedups.own_the_process() for _ in sys.argv[2:]]; "
            "heatmaps.save_heatmaps(sys.argv[1], 'heads', [('h', list('abc'), list('abc'), np.eye(3), None)] * 2); "
            "from matplotlib.axes import Axes; from matplotlib.lines import Line2D; "
            "Later = type('Later', (Line2D,), {}); "
            "print(Line2D.set.__doc__ is None, 'linewidth' in str(inspect.signature(Line2D.set)), "
            "Axes.set.__qualname__, Later.set.__doc__.startswith('Set multiple'))")


def test_a_slide_imports_matplotlib_without_the_set_docs_and_draws_the_same(tmp_path):
    """The command line's matplotlib (its process owned, as `main` says) leaves out every
    Artist's `set()` signature and docstring (0.1 s of its import): the same PNG bytes as with
    them; a class defined afterwards gets its docs, and a library call (a notebook's
    `help(Line2D.set)`) keeps them all."""
    for own, expected in ((True, "True False Axes.set True"), (False, "False True Axes.set True")):
        out = subprocess.run([sys.executable, "-c", SET_DOCS, str(tmp_path / f"{own}.png"),
                              *["own"] * own], capture_output=True, text=True, timeout=300)
        assert out.stdout.split() == expected.split(), out.stderr
    assert (tmp_path / "True.png").read_bytes() == (tmp_path / "False.png").read_bytes()


def test_torch_broadcast_shapes_works_without_the_kernels_loaded_at_start():
    """`torch.broadcast_shapes` reads `torch._refs`, which the meta kernels' import brought:
    `--why` on the chapter's module calls it (it lines up the scores' operands), and in the
    command line reading it loads the kernels then (a MiniLM run never loads them: above)."""
    done = run(["explain", "--module", "example:chapter_torch", "--why"])
    assert done.returncode == 0, done.stderr
    assert "torch._meta_registrations" in done.imported


WHOLE_TORCH = '''
import torch
import torch.nn as nn
from torch.nn.attention.flex_attention import flex_attention
from torch.utils.checkpoint import checkpoint


class WholeTorch(nn.Module):
    """Attention through the parts of torch that import torch._decomp (torch.func.vmap,
    torch.utils.checkpoint, torch.testing) and that trace a graph (flex_attention)."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))

    def split(self, x):
        B, T, _ = x.shape
        return x.view(B, T, self.h, self.d_k).transpose(1, 2)

    def forward(self, x):
        q, k, v = self.split(self.W_q(x)), self.split(self.W_k(x)), self.split(self.W_v(x))
        scores = torch.func.vmap(lambda a, b: a @ b.mT, in_dims=1, out_dims=1)(q, k) / self.d_k ** 0.5
        out = checkpoint(torch.softmax, scores, -1, use_reentrant=False) @ v
        torch.testing.assert_close(out, flex_attention(q, k, v))
        B, H, T, d = out.shape
        return self.W_o(out.transpose(1, 2).reshape(B, T, H * d))
'''


def test_a_module_may_use_any_of_torch_in_the_command_line(tmp_path):
    """The command line imports torch without its meta kernels, so torch._decomp and torch._refs
    arrive later: a user's torch.func.vmap, checkpoint or torch.testing imports them, in a circle
    unless the kernels come first; and flex_attention traces its graph through the recorder."""
    (tmp_path / "whole_torch.py").write_text(WHOLE_TORCH)
    done = run(["verify", "--module", f"{tmp_path / 'whole_torch.py'}:WholeTorch",
                "--d-model", "32", "--heads", "4"])
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Right: it computes what the lecture's module computes." in done.stdout
