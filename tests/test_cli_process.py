"""The installed command as a shell script sees it: real processes, exit codes, no tracebacks."""

import os
import subprocess
import sys

import pytest
import typer
from guide import BLOCKS

from mha_trace import __version__
from mha_trace.cli import app

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers


def run(*args, env=None, input=None):
    env = {**os.environ, **(env or {})}
    env.pop("COLUMNS", None)
    return subprocess.run(args, capture_output=True, text=True, env=env, input=input, timeout=120)


def test_version_from_console_script_and_module():
    assert run("mha-trace", "--version").stdout == f"mha-trace {__version__}\n"
    assert run(sys.executable, "-m", "mha_trace", "--version").stdout == f"mha-trace {__version__}\n"


def test_error_in_a_real_process_is_one_line_without_traceback():
    p = run("mha-trace", "shapes", "--d-model", "10", "--heads", "3")
    assert p.returncode == 2
    assert p.stderr == "Error: --heads: d_model=10 is not divisible by heads=3 (valid head counts: 1, 2, 5, 10)\n"
    assert "Traceback" not in p.stderr


def test_piped_output_is_plain_and_same_bytes_in_another_process(cli):
    piped = run("mha-trace", "shapes", "--seq", "6")
    assert piped.returncode == 0 and piped.stdout == cli("shapes", "--seq", "6").stdout
    assert "\x1b[" not in piped.stdout


def test_reader_closing_the_pipe_is_not_an_error():
    p = subprocess.run("mha-trace shapes --seq 64 | head -n 2", shell=True, capture_output=True,
                       text=True, timeout=120)
    assert p.stdout.startswith("shapes: batch=2 seq=64")
    assert "Traceback" not in p.stderr and "Error" not in p.stderr


def test_help_does_not_import_torch():
    code = ("import sys; from typer.testing import CliRunner; from mha_trace.cli import app; "
            "r = CliRunner(); [r.invoke(app, a) for a in (['--help'], ['shapes', '--help'])]; "
            "print('torch' in sys.modules)")
    assert run(sys.executable, "-c", code).stdout.strip() == "False"


REFUSED_BEFORE_TORCH = [  # flags that clash, or go with a model: no torch needed to say so
    ["shapes", "--d-model", "7", "--heads", "2"], ["explain", "--heads", "3"],
    ["heads", "--d-model", "7", "--heads", "2"], ["explain", "--d-model", "7"], ["heads", "--concat"],
    ["explain", "--by-head"], ["explain", "--layer", "2"], ["heads", "--overview"],
    ["ablate", "--rank"], ["ablate", "--prune"], ["ablate", "--sentence", "hi"],
    ["explain", "--include-inputs", "--model", "minilm"],
    # a config's picks: its heads and tokens are known before its run is built
    ["explain", "--token", "nosuch"], ["explain", "--token", "cat", "--head", "3"],
    ["explain", "--position", "9"], ["explain", "--token", "cat", "--position", "3"],
    ["explain", "--config", "chicken-road", "--token", "zz"], ["heads", "--head", "0"],
    ["heads", "--config", "chicken-road", "--heads", "4", "--head", "5"], ["ablate", "--head", "1,3"],
    ["ablate", "--head", "1,x"], ["compare", "--heads", "3"], ["compare", "--heads", "1,x"],
    # a model's --layer and --head, against the sizes its registry entry declares
    ["heads", "--model", "minilm", "--head", "6.13"], ["explain", "--model", "smollm2", "--head", "31.1"],
    ["heads", "--model", "minilm", "--layer", "7"], ["ablate", "--model", "minilm", "--head", "1.1,7.1"],
    ["heads", "--model", "minilm", "--layer", "2", "--head", "3.1"],
    ["explain", "--model", "whisper", "--audio", "examples/audio/cat.wav", "--head", "5.1", "--why"],
    ["patch", "--model", "smollm2", "--by-position", "31.1"], ["patch", "--clean", "a b"],
    ["patch", "--sender", "1.1"], ["patch", "--sender", "1.1", "--receiver", "2.10"],
    # round 5: a metric nobody chose, a clash, an odd head width for RoPE, a tile without tiles
    ["patch", "--metric", ""], ["patch", "--sender", "1.1", "--receiver", "2.1", "--by-input"],
    ["patch", "--sender", "1.1", "--receiver", "2.1,2.2"],
    ["train", "--rope", "--d-model", "4", "--heads", "4"], ["train", "--rope", "--d-model", "12", "--heads", "4"],
    ["train", "--rope", "--d-model", "10", "--heads", "2"], ["explain", "--impl", "tiled", "--why"],
    ["explain", "--block-k", "2"], ["explain", "--rope-planes", "--impl", "tiled"],
    # MLA: the chapter's Q, K, V are given by hand; its walk is split by part, not by source
    ["heads", "--latent", "16"], ["explain", "--config", "chicken-road", "--latent", "16", "--why"],
]


def test_wrong_flags_are_refused_before_torch_is_imported():
    """Each refusal in one process, torch looked for after each: a wrong flag is answered in a
    fraction of the second torch takes to import."""
    code = ("import sys; from typer.testing import CliRunner; from mha_trace.cli import app; "
            f"runs = [CliRunner().invoke(app, a) for a in {REFUSED_BEFORE_TORCH!r}]; "
            "print([r.exit_code for r in runs], 'torch' in sys.modules)")
    assert run(sys.executable, "-c", code).stdout == f"{[2] * len(REFUSED_BEFORE_TORCH)} False\n"


COMMANDS = sorted(typer.main.get_command(app).commands)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_and_option_has_help_with_an_example(name):
    command = typer.main.get_command(app).commands[name]
    assert "Example: mha-trace " + name in command.help
    for param in command.params:
        if param.name != "help":
            assert "Example:" in (param.help or ""), f"{name} {param.name}"


def test_debug_shows_the_traceback_wherever_it_stands(cli):
    from mha_trace.errors import MhaError

    p = run("mha-trace", "--debug", "shapes", "--heads", "3", "--d-model", "10")
    assert p.returncode != 0 and "Traceback" in p.stderr and "MhaError" in p.stderr
    with pytest.raises(MhaError):  # after the command's options too: raised, not one line
        cli("shapes", "--heads", "3", "--d-model", "10", "--debug")


def test_meta_trace_imports_neither_sympy_nor_dynamo_and_leaves_no_stand_ins():
    code = ("import sys; from mha_trace.runs.run import Sizes, from_sizes; from mha_trace.analyses.shapes import "
            "trace_run; r = trace_run(from_sizes(Sizes(batch=1, seq=64, d_model=96, heads=8, "
            "kv_heads=2, mask='causal', pad=3, device='meta'))); "
            "print(sorted(n for n in ('sympy', 'torch._dynamo', "
            "'torch.fx.experimental.symbolic_shapes') if n in sys.modules), r.largest.shape)")
    assert run(sys.executable, "-c", code).stdout.strip() == "[] (1, 8, 64, 64)"


def _help_examples():
    import re

    for name, command in sorted(typer.main.get_command(app).commands.items()):
        for text in re.findall(r"Example: mha-trace (.*?)(?:\n\n|\n(?=Example)|$)", command.help, re.S):
            yield name, " ".join(text.split())


SHOWN = {cmd.split(" | ")[0].strip() for _, cmd, _ in BLOCKS}  # what tests/test_readme.py runs
RUN_HERE = [(name, example) for name, example in _help_examples() if f"mha-trace {example}" not in SHOWN]


def test_the_help_examples_the_guide_shows_are_run_there():
    """A help example that a block of the guide runs, as it is, is run there once (and its
    output compared): the rest run below. Both lists are real: a renamed example fails one."""
    shown = [example for _, example in _help_examples() if f"mha-trace {example}" in SHOWN]
    assert len(shown) >= 10 and len(RUN_HERE) >= 30
    assert "survey --model smollm2 --induction --ablate-top 5" in shown


@pytest.mark.parametrize("name,example", RUN_HERE, ids=lambda x: x)
def test_every_help_example_runs(cli, name, example, tmp_path, monkeypatch):
    import shlex

    if any(f in example for f in ("my.txt", "--png", "--html", "--svg", "run.pt")):  # the user's files, or written
        monkeypatch.chdir(tmp_path)
        (tmp_path / "my.txt").write_text("The cat sat on the mat.\nWhere did you leave the keys?\n")
        from mha_trace.models import checkpoints, training

        checkpoints.save(training.run_training(training.Spec.of("induction", steps=5, snapshots=2)),
                      "run.pt")  # two layers: composition has a later layer to read the first
    if "class/" in example:  # a lecturer's folder of submissions: two students
        from pathlib import Path

        monkeypatch.chdir(tmp_path)
        skeleton = (Path(__file__).parent / "classroom" / "skeleton.py").read_text()
        (tmp_path / "class").mkdir()
        (tmp_path / "class" / "alice.py").write_text(skeleton)
        (tmp_path / "class" / "bob.py").write_text(skeleton.replace("/ math.sqrt(D)", "/ D"))
    if "--prune" in example:  # the whole corpus takes 45 seconds: tests/test_pruning.py runs it small
        from mha_trace.models import corpus

        from mha_trace.analyses import pruning
        monkeypatch.setattr(corpus, "bundled", lambda: corpus.Corpus("2 sentences", [
            "The cat sat on the mat.", "Where did you leave the keys?"]))
        monkeypatch.setattr(pruning, "FRACTIONS", (0, 1))
    result = cli(*shlex.split(example))
    if name == "explore":  # its options pass; then, without a terminal, it says what it needs
        assert result.stderr.startswith("Error: explore is interactive and needs a terminal")
        return
    assert result.exit_code == 0, (example, result.stderr)
    assert result.stdout.strip() and (result.stderr == "" or result.stderr.startswith("Wrote "))


@pytest.mark.parametrize("name", COMMANDS)
def test_file_examples_are_named_after_their_command(name):
    command = typer.main.get_command(app).commands[name]
    for param in command.params:
        if param.name in ("svg", "html", "png"):
            assert param.help.endswith(f"Example: --{param.name} {name}.{param.name}"), param.help


@pytest.mark.parametrize("args,shown", [
    (("verify", "--d-model", "16", "--heads", "2", "--seq", "3"), "All comparisons pass."),
    (("verify", "--module", "example:chapter_torch", "--d-model", "16", "--heads", "2"), "Right:"),
    (("train", "--task", "previous-token", "--steps", "2", "--snapshots", "2"), "previous-token"),
    (("ablate", "--model", "minilm", "--head", "1.1"), "without head 1.1"),
])
def test_each_record_shows_in_a_fresh_process(args, shown):
    """A command imports the renderers of what it prints: in a process of its own nothing else
    has imported them (in-process tests share one interpreter, so they cannot tell)."""
    p = run(sys.executable, "-m", "mha_trace", *args)
    assert p.returncode == 0 and p.stderr == "", p.stderr
    assert shown in p.stdout
