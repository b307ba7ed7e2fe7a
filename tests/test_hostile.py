"""Nothing a user types or feeds in breaks the tool: generated cases per category.

For every case: the exit code is in the documented set (0 ok, 1 environment or failed check,
2 bad input, 130 interrupted), stderr is empty or one `Error:` line (the failure view of a user's
module is the documented exception), no traceback, and no file changed that was not asked for.
In-process with CliRunner where possible; subprocesses where the environment must differ.
"""

import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import xml.dom.minidom
from pathlib import Path

import numpy as np
import pytest

EXIT_CODES = {0, 1, 2}


def check_clean(result, codes=EXIT_CODES):
    assert result.exit_code in codes, (result.exit_code, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if not line.startswith("Wrote ")]
    assert lines == [] or (len(lines) == 1 and lines[0].startswith("Error: ")), result.stderr
    assert "\x1b" not in result.stderr


def snapshot(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.is_file()}


# 1. sizes ---------------------------------------------------------------------------------------

VALUES = ["-1", "0", "1", "2", "3", "7", "8", "64", "4096", "2147483648", str(10**23), "1" + "0" * 399,
          "x", "1.5", ""]


def _random_flags(rng: random.Random, big: bool) -> list:
    flags = []
    for flag in ("--batch", "--seq", "--d-model", "--heads", "--kv-heads", "--pad", "--seed"):
        if rng.random() < 0.6:
            value = rng.choice(VALUES) if big else rng.choice(VALUES[:8] + VALUES[-3:])
            flags += [flag, value]
    # the modern options: RoPE, windows, the fused path, decoding
    for flag, values in (("--rope", None), ("--rope-base", ["nan", "inf", "-1", "1", "1e308", "x"]),
                         ("--window", VALUES[:8]), ("--decode", ["0", "1", "3", "100000", "-2"]),
                         ("--impl", ["sdpa", "fused"])):
        if rng.random() < 0.2:
            flags += [flag] if values is None else [flag, rng.choice(values)]
    return flags


@pytest.mark.parametrize("seed", range(6))
def test_random_size_flags(cli, tmp_path, monkeypatch, seed):
    monkeypatch.chdir(tmp_path)
    rng = random.Random(seed)
    for _ in range(30):
        command = rng.choice(["shapes", "verify", "cost", "shapes"])
        big = command == "cost" or rng.random() < 0.5
        flags = _random_flags(rng, big)
        if command == "shapes" and big:
            flags += ["--device", "meta"]
        if command == "cost":
            flags = [f for f in flags if f != "--seed"] if "--seed" not in flags else flags[:flags.index("--seed")]
        result = cli(command, *flags)
        check_clean(result)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,message", [
    (("cost", "--d-model", "1000000000001", "--heads", "2"),
     "--d-model: d_model=1000000000001 is too large (at most 2,147,483,647)"),
    (("cost", "--d-model", "2147483646", "--heads", "4"),
     "--heads: d_model=2147483646 is not divisible by heads=4 (valid head counts: 1, 2, 3, 6, 7, 9, "
     "11, 14, 18, 21, 22, 31 (12 of the 192 that divide 2,147,483,646))"),
    (("shapes", "--seed", str(2**64)), "--seed: seed=18446744073709551616 must be from 0 to 2**64 - 1"),
    (("cost", "--seq", "1" + "0" * 399), "--seq: seq=1000000000…(400 digits) is too large (at most 2,147,483,647)"),
    (("cost", "--d-model", str(10**23)), "--d-model: d_model=100000000000000000000000 is too large (at most 2,147,483,647)"),
    (("shapes", "--device", "meta", "--batch", "100000", "--seq", "10000000", "--d-model", "8"),
     "--seq: the scores would be a [100000, 8, 10000000, 10000000] tensor of 3.20e+20 bytes, more "
     "than torch can address even on the meta device (at most 2**62 bytes); the cost command counts such sizes"),
])
def test_size_bounds_are_named(cli, args, message):
    result = cli(*args)
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")


def test_divisors_of_large_numbers():
    from mha_trace.core.validate import divisors

    assert divisors(2**31 - 1) == [1, 2**31 - 1]  # a prime: √n steps, not n
    assert divisors(10**12 + 1) == [1, 73, 137, 10001, 99990001, 7299270073, 13698630137, 10**12 + 1]
    assert divisors(36) == [1, 2, 3, 4, 6, 9, 12, 18, 36]


# 2. configs -------------------------------------------------------------------------------------

VALID = (Path(__file__).parent.parent / "configs" / "cat-sat-on-mat.toml").read_text()


def _malformed(rng: random.Random) -> bytes:
    lines = VALID.splitlines()
    kind = rng.randrange(12)
    if kind == 0:  # drop a line
        del lines[rng.randrange(len(lines))]
    elif kind == 1:  # a value of the wrong type
        i = rng.choice([n for n, l in enumerate(lines) if "=" in l])
        lines[i] = lines[i].split("=")[0] + "= " + rng.choice(['"x"', "true", "[]", "{}", "-3", "1e400",
                                                                "nan", "inf", "0", "[[1]]"])
    elif kind == 2:  # numbers too large to square
        return VALID.replace("1.0", rng.choice(["1e160", "1e300", "-1e200"])).encode()
    elif kind == 3:  # an unknown key
        lines.insert(1, rng.choice(["haeds = 2", "qkv = 3", "[extra]", "mask = 'sideways'"]))
    elif kind == 4:  # truncated
        return VALID[: rng.randrange(len(VALID))].encode()
    elif kind == 5:  # random bytes
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    elif kind == 6:  # deep nesting
        depth = rng.choice([50, 5000, 100000])
        return ("a = " + "[" * depth + "]" * depth).encode()
    elif kind == 7:  # control characters in text
        return VALID.replace('"cat"', '"c\\u001b[31mat\\u0007"').encode()
    elif kind == 8:  # sizes that do not fit each other
        return VALID.replace("heads = 2", rng.choice(["heads = 3", "heads = 0", "heads = 99",
                                                      "heads = 2\nkv_heads = 3", "heads = 2\npad = 5",
                                                      "heads = 2\npad = -1", "heads = 2\nseed = 1"])).encode()
    elif kind == 9:  # a byte-order mark (valid)
        return b"\xef\xbb\xbf" + VALID.encode()
    elif kind == 10:  # an empty file
        return b""
    else:  # a row of the wrong length
        return VALID.replace("[1.0, 0.0, 1.0, 0.0]", "[1.0, 0.0, 1.0]", 1).encode()
    return "\n".join(lines).encode()


@pytest.mark.parametrize("seed", range(2))
def test_malformed_configs(cli, tmp_path, seed):
    rng = random.Random(seed)
    for n in range(33):
        path = tmp_path / f"c{n}.toml"
        path.write_bytes(_malformed(rng))
        before = snapshot(tmp_path)
        for command in ("heads", "explain", "verify"):  # compare and ablate read configs alike
            result = cli(command, "--config", str(path))
            check_clean(result, {0, 2})
            assert "nan" not in result.stdout.lower().split()
        assert snapshot(tmp_path) == before


# 3. paths ---------------------------------------------------------------------------------------

def test_paths_that_are_not_files(cli, tmp_path):
    fifo = tmp_path / "pipe.toml"
    os.mkfifo(fifo)
    (tmp_path / "bin.toml").write_bytes(b"\x7fELF\0\0\x01")
    (tmp_path / "latin.toml").write_bytes("title = 'caf\xe9'".encode("latin-1"))
    cases = {
        str(fifo): f"{fifo}: is a named pipe (FIFO), expected a .toml config file",
        "/dev/zero": "/dev/zero: is a character device, expected a .toml config file",
        str(tmp_path): f"{tmp_path}: is a directory, expected a .toml config file",
        str(tmp_path / "bin.toml"): f"{tmp_path / 'bin.toml'}: is a binary file, expected a .toml config file",
        str(tmp_path / "latin.toml"): f"{tmp_path / 'latin.toml'}: is not UTF-8 text (byte 12), expected a .toml config file",
        "some/dir/chicken-road.toml": "some/dir/chicken-road.toml: not found",
    }
    for path, message in cases.items():
        result = cli("heads", "--config", path)
        assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")
    result = cli("shapes", "--module", f"{fifo}:X")
    assert result.stderr == f"Error: --module {fifo}: is a named pipe (FIFO), expected a .py file\n"
    assert cli("cost", "--preset", "../README").stderr.startswith("Error: --preset '../README' is not bundled")


def test_a_byte_order_mark_is_accepted(cli, tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf" + VALID.encode())
    assert cli("heads", "--config", str(path)).stdout == cli("heads").stdout


# 4. files written -------------------------------------------------------------------------------

def test_outputs_never_overwrite_inputs_or_each_other(cli, tmp_path):
    config = tmp_path / "c.svg"  # a config may have any name
    config.write_text(VALID)
    module = tmp_path / "m.py"
    module.write_text(Path("examples/l04_mha.py").read_text())
    before = snapshot(tmp_path)
    cases = [
        (("heads", "--config", str(config), "--svg", str(config)),
         f"--svg: {config} is an input of this command ({config}); it is never overwritten"),
        (("heads", "--svg", str(tmp_path / "a.svg"), "--html", str(tmp_path / "a.svg")),
         f"--html: {tmp_path / 'a.svg'} does not end in .html or .htm"),
        (("heads", "--html", str(tmp_path / "a.html"), "--svg", str(tmp_path / "a.html")),
         f"--svg: {tmp_path / 'a.html'} does not end in .svg"),
        (("heads", "--png", str(tmp_path)),
         f"--png: {tmp_path} is a directory; give a file name, e.g. {tmp_path / 'slide.png'}"),
        (("heads", "--svg", str(tmp_path / "x.txt")), f"--svg: {tmp_path / 'x.txt'} does not end in .svg"),
    ]
    for args, message in cases:
        result = cli(*args)
        assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")
    assert snapshot(tmp_path) == before
    svg = tmp_path / "shapes.svg"
    assert cli("shapes", "--module", f"{module}:MultiHeadAttention", "--d-model", "8", "--heads",
               "2", "--svg", str(svg)).exit_code == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.svg", "m.py", "shapes.svg"]  # no temp files


def test_a_text_sentences_or_checkpoint_named_as_an_output_is_never_overwritten(cli, tmp_path):
    """The lecture notes read with --text or --sentences, or the run read with --checkpoint, named
    again as --html, --svg or --png: refused before anything runs or loads (the notes stay)."""
    notes, sentences = tmp_path / "notes.html", tmp_path / "sentences.svg"
    notes.write_text("the lecture notes\n")
    sentences.write_text("The cat sat on the mat\n")
    run = tmp_path / "run.png"
    run.write_bytes(b"not a checkpoint, never read")
    before = snapshot(tmp_path)
    for args, path, flag in [(("cache", "--text", str(notes), "--html", str(notes)), notes, "html"),
                             (("survey", "--model", "minilm", "--sentences", str(sentences), "--svg",
                               str(sentences)), sentences, "svg"),
                             (("heads", "--checkpoint", f"{run}@3", "--png", str(run)), run, "png")]:
        result = cli(*args)
        assert (result.exit_code, result.stderr) == (
            2, f"Error: --{flag}: {path} is an input of this command ({path}); it is never overwritten\n")
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("args,message", [
    (("cache", "--model", "smollm2", "--text", ""), "--text: give a text file, e.g. --text essay.txt"),
    (("cache", "--model", "smollm2", "--text", "{blank}"), "--text: {blank} holds no words: nothing to read"),
    (("heads", "--checkpoint", "{run}", "--sentence", "3 ² 5"), "--sentence: this run's text is token ids"),
    (("cache", "--checkpoint", "{run}", "--text", "{words}"), "--text: this run's text is token ids"),
    (("heads", "--checkpoint", "{run}", "--sentence", "3 ① 5"), "--sentence: this run's text is token ids"),
    (("heads", "--checkpoint", "{run}", "--sentence", "3 " + "9" * 5000), "--sentence: this run's text is token ids"),
])
@pytest.mark.slow
def test_texts_that_hold_nothing_to_read_are_refused_in_one_line(cli, tmp_path, default_run, args, message):
    """An empty --text is not the bundled corpus, a blank file is not 4 tokens, and a trained run's
    ids are 0-9 digits (str.isdigit takes '²' and '①'; int() refuses 5,000 digits)."""
    blank, words = tmp_path / "blank.txt", tmp_path / "words.txt"
    blank.write_text("  \n\t \n")
    words.write_text("hello world\n")
    fill = lambda a: a.format(blank=blank, run=default_run, words=words)
    result = cli(*map(fill, args))
    assert result.exit_code == 2 and result.stderr.startswith(f"Error: {fill(message)}")
    assert result.stderr.count("\n") == 1


def _run(*args, env=None, **kwargs):
    return subprocess.run(["mha-trace", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})}, **kwargs)


@pytest.mark.slow
def test_full_device_closed_stdout_and_ascii_terminal():
    with open("/dev/full", "w") as full:
        p = subprocess.run(["mha-trace", "shapes"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (1, "Error: cannot write the output: No space left on device\n")
    p = subprocess.run("mha-trace shapes >&-", shell=True, capture_output=True, text=True, timeout=120)
    assert (p.returncode, p.stderr) == (1, "Error: standard output is closed, so there is nowhere to print\n")
    p = _run("explain", env={"PYTHONIOENCODING": "ascii"})
    assert p.returncode == 0 and p.stderr == "" and "q[The] = [1.0, 0.0]" in p.stdout


# 5. hostile text --------------------------------------------------------------------------------

EVIL = '''title = "evil \\u001b[31mred\\u001b[0m"
tokens = ["a\\u001b]0;pwned\\u0007", "b|c", "c\\rd", "\\u202eevil"]
heads = 2
[qkv]
Q = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]]
K = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]]
V = [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.5, 0.5]]
'''


def test_control_characters_never_reach_the_terminal(cli, tmp_path):
    path = tmp_path / "evil.toml"
    path.write_text(EVIL)
    for command in ("heads", "explain", "compare", "ablate", "verify", "configs"):
        for fmt in ("table", "markdown", "json"):
            extra = ("--heads", "1,2") if command == "compare" else ()
            result = cli(command, "--config", str(path), "--format", fmt, *extra) \
                if command != "configs" else cli(command, "--format", fmt)
            check_clean(result, {0})
            assert not any(ch in result.stdout for ch in "\x1b\x07\r\u202e"), (command, fmt)
    assert "a\\x1b]0;pwned\\x07" in cli("heads", "--config", str(path)).stdout
    error = cli("explain", "--config", str(path), "--token", "zzz")
    assert error.stderr == ("Error: --token 'zzz' is not in the sentence (tokens: a\\x1b]0;pwned\\x07, "
                            "b|c, c\\rd, \\u202eevil)\n")
    markdown = cli("heads", "--config", str(path), "--format", "markdown").stdout
    assert "| b\\|c |" in markdown
    svg, page = tmp_path / "e.svg", tmp_path / "e.html"
    assert cli("heads", "--config", str(path), "--svg", str(svg), "--html", str(page)).exit_code == 0
    xml.dom.minidom.parse(str(svg))
    assert all(ord(ch) >= 32 or ch in "\n\t" for ch in page.read_text())


def test_a_200_character_token_still_makes_every_slide(cli, tmp_path):
    """A config's very long token: each slide cuts the label with an ellipsis (24 characters), so
    the walk's, its split's and the heatmaps' layouts keep room for their panels (the walk's and
    the heatmaps' refused to lay out; the split's collapsed with a warning on stderr)."""
    from PIL import Image

    long = "x" * 200
    path = tmp_path / "long.toml"
    path.write_text(f'sentence = "The {long} crossed"\nd_model = 16\nheads = 2\nseed = 0\nmask = "causal"\n')
    for args in (("explain", "--token", "crossed"), ("explain", "--token", "crossed", "--why"), ("heads",)):
        png = tmp_path / "slide.png"
        result = cli(*args, "--config", str(path), "--png", str(png), "--format", "json")
        assert result.exit_code == 0 and result.stderr.startswith(f"Wrote {png} ("), (args, result.stderr)
        assert result.stderr.count("\n") == 1 and Image.open(png).size == (1920, 1080)
        assert long in result.stdout  # the JSON keeps the whole token


# 6. user modules --------------------------------------------------------------------------------

ODD = '''
import os, sys, time, pathlib
import torch, torch.nn as nn
from helper_for_odd import scale


class Base(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)


class SysExit(Base):
    def forward(self, x):
        sys.exit(5)


class HardExit(Base):
    def forward(self, x):
        os._exit(7)


class Printer(Base):
    def forward(self, x):
        print("hello from forward")
        return self.proj(x) * scale


class BareAssert(Base):
    def forward(self, x):
        y = self.proj(x)
        assert y.shape[0] == 99
        return y


class Builtin(nn.Module):
    forward = print

    def __init__(self, d_model, heads):
        super().__init__()


class Sleeper(Base):
    def forward(self, x):
        pathlib.Path(os.environ["MARK"]).write_text("in forward")
        time.sleep(60)


class Ambiguous(Base):
    def forward(self, x):
        return torch.ones_like(x), torch.ones_like(x)


class Three(Base):
    def forward(self, x):
        return self.proj(x), x, x


class Five(Base):
    def forward(self, x):
        return (self.proj(x),) * 5


class GenExit(Base):
    def forward(self, x):
        raise GeneratorExit("bye")


class Bare(Base):
    def forward(self, x):
        raise BaseException("base")


class Warner(Base):
    def forward(self, x):
        import warnings
        warnings.warn("my own note", UserWarning)
        y = self.proj(x).T  # torch warns: .T of a 3-d tensor
        return y.T * scale
'''


@pytest.fixture
def odd(tmp_path):
    (tmp_path / "odd.py").write_text(ODD)
    (tmp_path / "helper_for_odd.py").write_text("scale = 2.0\n")
    return tmp_path / "odd.py"


@pytest.mark.parametrize("cls,code,message", [
    ("SysExit", 1, "SysExit from {path}: forward called sys.exit(5); the module ended itself"),
    ("HardExit", 1, "HardExit from {path}: forward called os._exit(7); the module ended itself"),
    ("BareAssert", 1, "forward raised at {path}:32: AssertionError (no message)"),
    ("Builtin", 2, "cannot call Builtin.forward(*args, sep=' ', end='\\n', file=None, flush=False): "
                   "expected one input (x) or three (q, k, v)"),
    ("Ambiguous", 1, "forward returned [2, 8, 8] and [2, 8, 8]: with seq = d_model = 8 neither shape "
                     "nor values tell the output from the weights (return (output, weights) with "
                     "different seq and d_model, e.g. --seq 9)"),
    ("Three", 1, "forward returned 3 values, expected the output or (output, weights)"),
    ("Five", 1, "forward returned 5 values, expected the output or (output, weights)"),
    ("GenExit", 1, "GenExit from {path}: forward raised GeneratorExit: bye (a BaseException that is "
                   "not an Exception)"),
    ("Bare", 1, "Bare from {path}: forward raised BaseException: base (a BaseException that is not "
                "an Exception)"),
])
@pytest.mark.slow
def test_odd_modules_fail_cleanly(cli, odd, cls, code, message):
    """A module that ends its process (os._exit) runs in a real one, once; the rest (sys.exit and
    GeneratorExit are caught as they would be there) in this, in both formats."""
    for fmt in ("json",) if cls == "HardExit" else ("table", "json"):
        args = ("shapes", "--module", f"{odd}:{cls}", "--d-model", "8", "--heads", "2", "--seq", "8",
                "--format", fmt)
        if cls == "HardExit":
            p = _run(*args)
            returncode, stdout, stderr = p.returncode, p.stdout, p.stderr
        else:
            result = cli(*args)
            returncode, stdout, stderr = result.exit_code, result.stdout, result.stderr
        assert returncode == code, stderr
        assert stderr == f"Error: {message.format(path=odd)}\n"
        if fmt == "json" and cls == "BareAssert":  # a failed forward is in the JSON too
            assert json.loads(stdout)["failure"]["message"] == "AssertionError (no message)"


@pytest.mark.slow
def test_prints_in_user_code_go_to_stderr_and_json_stays_valid(odd):
    p = _run("shapes", "--module", f"{odd}:Printer", "--d-model", "8", "--heads", "2", "--format", "json")
    assert p.returncode == 0
    assert json.loads(p.stdout)["command"] == "shapes"  # the sibling import worked, too
    assert p.stderr == f"Printer from {odd}: forward printed: hello from forward\n"


def test_warnings_in_user_code_are_one_line_each_at_the_users_line(cli, odd):
    """A warning of the user's own and one torch raises about the user's call: each said once
    (forward runs more than once), at the user's line, never a warning pointing into the tool
    or torch's C++ source; the JSON stays whole."""
    result = cli("shapes", "--module", f"{odd}:Warner", "--d-model", "8", "--heads", "2",
                 "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["command"] == "shapes"
    line = next(i for i, text in enumerate(ODD.splitlines(), 1) if "torch warns" in text)
    own, torchs = result.stderr.splitlines()
    assert own == f"Warner from {odd}: forward warned at {odd}:{line - 1}: UserWarning: my own note"
    assert torchs.startswith(f"Warner from {odd}: forward warned at {odd}:{line}: UserWarning: "
                             "The use of `x.T` on tensors of dimension other than 2")
    assert "Triggered internally" not in torchs and torchs.endswith("of a tensor.")


def test_non_python_module_paths(cli, tmp_path):
    text = tmp_path / "mha.txt"
    text.write_text("class X: pass\n")
    assert cli("shapes", "--module", f"{text}:X").stderr == f"Error: --module {text}: expected a .py file\n"


def ctrl_c_as_a_terminal_sends_it():
    """In the child: SIGINT as a shell in a terminal leaves it. A suite started in the
    background (`pytest &`) has it ignored, and a child would inherit that: no Ctrl-C to test."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.slow
def test_ctrl_c_prints_one_line_and_exits_130(odd, tmp_path):
    mark = tmp_path / "mark"
    p = subprocess.Popen(["mha-trace", "shapes", "--module", f"{odd}:Sleeper", "--d-model", "8",
                          "--heads", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "MARK": str(mark)}, preexec_fn=ctrl_c_as_a_terminal_sends_it)
    for _ in range(600):
        if mark.exists():
            break
        time.sleep(0.1)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert (p.returncode, err) == (130, "Error: interrupted (Ctrl-C)\n")


@pytest.mark.slow
@pytest.mark.parametrize("sig,code,message", [("SIGINT", 130, "interrupted (Ctrl-C)"),
                                              ("SIGTERM", 143, "terminated (SIGTERM)")])
def test_a_signal_while_the_command_line_and_torch_load_is_its_one_line(odd, tmp_path, sig, code,
                                                                        message):
    """A signal while Python imports the command line or while torch loads once gave a
    KeyboardInterrupt traceback, a silent death, exit 134 (raised inside torch's loading) or
    nothing at all (swallowed: exit 0). It is its line and code at any moment from the first line
    of the tool's own code, which catches SIGTERM (then SIGINT) before it imports anything: the
    signal comes 0.02 s after that (the command line importing) and 0.4 s after (torch loading).
    Before it, the interpreter is still starting (its site imports: 40 ms on an idle core, over
    0.1 s on a busy one), and a Ctrl-C there is Python's own."""
    for delay in (0.02, 0.4):
        p = subprocess.Popen(["mha-trace", "shapes", "--module", f"{odd}:Sleeper", "--d-model", "8",
                              "--heads", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "MARK": str(tmp_path / "mark")},
                             preexec_fn=ctrl_c_as_a_terminal_sends_it)
        catches_sigterm = lambda: int(_status(p.pid)["SigCgt"], 16) >> (signal.SIGTERM - 1) & 1
        for _ in range(30_000):
            if p.poll() is not None or catches_sigterm():
                break
            time.sleep(0.001)
        time.sleep(delay)
        p.send_signal(getattr(signal, sig))
        _, err = p.communicate(timeout=60)
        assert (p.returncode, err) == (code, f"Error: {message}\n"), delay


def _status(pid: int) -> dict:
    """A process's /proc/PID/status, field by field (SigCgt: the signals it catches, a hex mask)."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return dict(line.split(":\t", 1) for line in lines if ":\t" in line)


# 7. memory guard --------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["v1", "v2"])
def test_cgroup_limits_are_read(tmp_path, monkeypatch, version):
    from mha_trace.core import runtime

    files = {"v2": {"memory.max": "1000000", "memory.current": "400000"},
             "v1": {"memory/memory.limit_in_bytes": "2000000", "memory/memory.usage_in_bytes": "500000"}}
    for name, value in files[version].items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(value + "\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(
        str(path).replace("/sys/fs/cgroup", str(tmp_path)), *a, **k))
    assert runtime._cgroup_free() == (600000 if version == "v2" else 1500000)


@pytest.mark.slow
def test_address_space_limit_is_respected():
    p = subprocess.run("ulimit -v 3000000; mha-trace shapes --seq 4000", shell=True,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert p.stderr.startswith("Error: this run needs about 3.0 GiB on cpu") and "GiB is free" in p.stderr


@pytest.mark.parametrize("command", ["shapes", "heads --model minilm", "verify", "predict"])
@pytest.mark.slow
def test_an_address_space_too_small_for_torch_is_one_line(command):
    """torch's C++ aborts (std::bad_alloc, no Python error) under ulimit -v 400000: refused first."""
    p = subprocess.run(f"ulimit -v 400000; mha-trace {command}", shell=True, capture_output=True,
                       text=True, timeout=120)
    assert (p.returncode, p.stdout) == (1, "")
    assert p.stderr == ("Error: the address-space limit (ulimit -v) is 390 MiB, and loading torch "
                        "needs about 1024 MiB (raise it: ulimit -v unlimited)\n")


@pytest.mark.slow
def test_the_commands_that_never_import_torch_run_in_a_small_address_space():
    free = subprocess.run("ulimit -v 400000; mha-trace cost && mha-trace configs", shell=True,
                          capture_output=True, text=True, timeout=120)
    assert free.returncode == 0 and free.stderr == "" and "cost: custom" in free.stdout
    assert "animal-street" in free.stdout  # both ran to the end


# 8. stable output -------------------------------------------------------------------------------

@pytest.mark.slow
def test_verify_prints_the_same_whatever_the_thread_count(cli):
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        one = cli("verify", "--seq", "64", "--d-model", "256").stdout
    finally:
        torch.set_num_threads(before)
    four = _run("verify", "--seq", "64", "--d-model", "256", env={"OMP_NUM_THREADS": "4"})
    assert four.returncode == 0 and four.stdout == one


# 8. models: sentences and head specs ------------------------------------------------------------

RAW = ("\x1b", "\x07", "\r", "\x9b", "\x85", "\u202e", "\u2066", "\ud800")  # never printed raw
SENTENCES = ["cat\x1b[31m sat on the mat", "the \x1b]0;pwned\x07 cat sat", "a\rb c d", "cat \x9b31m sat",
             "\u202eevil cat sat", "cat \u2066sat\u2069 down", "cat \ud800 sat", "\udcff\udcfe cat"]


def _no_raw(text: str) -> bool:
    return not any(ch in text for ch in RAW)


@pytest.mark.parametrize("sentence", SENTENCES, ids=lambda s: s.encode("unicode_escape").decode())
@pytest.mark.slow
def test_model_sentences_never_send_control_characters(cli, sentence):
    """Whatever the sentence holds, each command's output (table and JSON) shows it escaped;
    text that is not text (a lone surrogate) is refused with one line."""
    runs = [("heads", "--model", "minilm", "--layer", "1"), ("explain", "--model", "minilm"),
            ("ablate", "--model", "minilm", "--head", "1.1"), ("survey",)]
    for args in runs:
        for fmt in ("table", "json"):
            result = cli(*args, "--sentence", sentence, "--format", fmt)
            check_clean(result, {0, 2})
            assert _no_raw(result.stdout) and _no_raw(result.stderr), (args, fmt)
            if "\ud800" in sentence or "\udcff" in sentence:
                assert result.exit_code == 2 and "which is not text" in result.stderr
            else:
                assert result.exit_code == 0, result.stderr
                if fmt == "json":
                    json.loads(result.stdout)


@pytest.mark.slow
def test_smollm2_labels_and_predictions_are_escaped(cli):
    for args in (("heads", "--model", "smollm2", "--head", "1.1"), ("predict", "--generate", "1")):
        for fmt in ("table", "json"):
            result = cli(*args, "--sentence", "The \x1b[31mcat\x9b sat \u202eon", "--format", fmt)
            check_clean(result, {0})
            assert _no_raw(result.stdout), (args, fmt)


DIGITS = ["²", "①", "٣", "４", "𝟙", "Ⅳ", "½", "٫"]  # superscript, circled, Arabic-Indic, fullwidth, ...
HEAD_SPECS = ([f"{d}.1" for d in DIGITS] + [f"4.{d}" for d in DIGITS] + DIGITS
              + ["4 . 2", " 4.2", "4.2 ", "4.2.1", "", ".", "-1.2", "4.-2", "1e3.1", "4.1\x1b[31m",
                 "9" * 40 + ".1", "4.0", "0.1"])


@pytest.mark.parametrize("spec", HEAD_SPECS, ids=lambda s: s.encode("unicode_escape").decode())
def test_head_specs_in_every_digit_class(cli, spec):
    """A head is ASCII digits (LAYER.HEAD with a model): anything else is one Error line, exit 2
    (ablate's comma-separated list may have spaces around each head)."""
    ablate = [("ablate", "--model", "minilm")] if spec.strip() == spec else []
    for args in [("heads", "--model", "minilm"), ("explain", "--model", "minilm"), *ablate,
                 ("heads",), ("explain",)]:
        result = cli(*args, "--head", spec)
        check_clean(result, {2})
        assert result.stdout == "" and _no_raw(result.stderr), (args, spec)


@pytest.mark.parametrize("args,message", [
    (("heads", "--model", "minilm", "--sentence", ""), "--sentence is empty"),
    (("heads", "--model", "minilm", "--sentence", "   "), "--sentence is empty"),
    (("explain", "--model", "minilm", "--sentence", ""), "--sentence is empty"),
    (("survey", "--sentence", " "), "--sentence is empty"),
    (("heads", "--model", ""), "--model '' is not one of minilm, smollm2, whisper (or a run saved by mha-trace train: --checkpoint run.pt)"),
    (("survey", "--from", "", "--to", "a"), "--from is empty"),
    (("survey", "--from", "it", "--to", ","), "--to is empty"),
    (("survey", "--from", "zebra", "--to", "cat"), "--from: no sentence holds 'zebra'"),
    (("survey", "--model", "smollm2", "--sentence", "a"), "a survey scores each query's previous"),
    (("heads", "--model", "minilm", "--rope-base", "1e308"), "--rope-base does not go with --model"),
])
@pytest.mark.slow
def test_empty_and_unusable_model_input_is_refused(cli, args, message):
    result = cli(*args)
    check_clean(result, {2})
    assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_queries_that_see_no_key_are_not_a_false_failure(cli):
    """A window of 1 over padding leaves queries with no key: the module gives them no weight, the
    numpy reference says the same by hand, nn.MultiheadAttention is compared on the other rows."""
    result = cli("verify", "--seq", "4", "--window", "1", "--pad", "3")
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    assert "3 queries see no key: compared on the others" in result.stdout


def test_numpy_reference_gives_a_query_with_no_key_no_weight():
    import numpy as np
    import torch

    from mha_trace.core.attention import MultiHeadAttention
    from mha_trace.analyses.references import numpy_reference

    torch.manual_seed(0)
    module = MultiHeadAttention(8, 2).double()
    x = torch.randn(1, 3, 8, dtype=torch.float64)
    keep = torch.tensor([[True, False, False], [False, False, False], [True, True, False]])
    out, weights = numpy_reference(module, x, x, x, keep)
    assert np.array_equal(weights[0, :, 1], np.zeros((2, 3)))  # the query that sees nothing
    np.testing.assert_allclose(out[0, 1], module.W_o.bias.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(weights[0, :, 0, 0], 1.0)


@pytest.mark.parametrize("init", ["d_model={[1]: 2}", "d_model=None, **x", "d_model=x", "1, 2",
                                  "d_model=(", "a=1) + f(b=2", "d_model=" + "[" * 5000])
def test_odd_init_values_are_one_line(cli, init):
    result = cli("heads", "--module", "example:l04", "--init", init)
    check_clean(result, {2})
    assert "expected name=value pairs" in result.stderr and "0x" not in result.stderr


def test_a_users_module_gets_its_png_too(cli, tmp_path):
    """heads --module --png writes the picture (it used to exit 0 with no file and no word)."""
    import struct

    png = tmp_path / "mine.png"
    result = cli("heads", "--module", "example:committee", "--png", str(png))
    check_clean(result, {0})
    header = png.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", header[16:24]) == (1920, 1080)


@pytest.mark.slow
def test_stdin_closed():
    """`explore <&-` and `--step <&-`: no stdin at all is a refusal or a plain run, never a bug."""
    close = lambda: os.close(0)
    p = _run("explore", preexec_fn=close, stdin=None)
    assert p.returncode == 2 and p.stderr.startswith("Error: explore is interactive and needs a")
    p = _run("heads", "--step", preexec_fn=close, stdin=None)
    assert p.returncode == 0 and p.stderr == "" and "Head 1 of 2" in p.stdout


@pytest.mark.slow
def test_outputs_never_write_through_a_symlink(cli, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    for option, name in (("--svg", "link.svg"), ("--html", "link.html"), ("--png", "link.png")):
        link = tmp_path / name
        link.symlink_to(target)
        check_clean(cli("heads", option, str(link)), {0})
        assert target.read_text() == "precious" and not link.is_symlink() and link.stat().st_size > 0


@pytest.mark.slow
def test_a_pasted_page_is_refused_before_it_runs(cli):
    """The token guard: a sentence past a model's limit is refused with what it would hold, before
    any layer runs; --max-tokens goes on anyway, up to the model's own context."""
    page = " ".join(["the cat sat on the mat and"] * 50)  # 350 tokens with SmolLM2's
    for args in (("heads", "--model", "smollm2"), ("explain", "--model", "smollm2"),
                 ("shapes", "--model", "smollm2"), ("survey", "--model", "smollm2"), ("predict",)):
        result = cli(*args, "--sentence", page)
        check_clean(result, {2})
        assert result.stderr.startswith("Error: --sentence has 350 tokens; every view keeps all "
                                        "30 × 9 heads' T × T weights, about 378.5 MiB"), args
        assert "(--max-tokens 350 goes on anyway)" in result.stderr
    raised = cli("heads", "--model", "smollm2", "--sentence", page, "--max-tokens", "350",
                 "--head", "1.1", "--format", "json")
    assert raised.exit_code == 0 and len(json.loads(raised.stdout)["tokens"]) == 350
    longer = cli("heads", "--model", "minilm", "--sentence", " ".join(["the cat sat on"] * 200))
    check_clean(longer, {2})
    assert longer.stderr.endswith("all-MiniLM-L6-v2 reads at most 512\n")


# 9. time guards: refused before the long part runs, with the estimate and what fits ------------

@pytest.mark.slow
def test_ranking_every_head_is_refused_past_the_time_guard(cli):
    """270 SmolLM2 ablations over 36 tokens: about 46 s on 2 cores, over the 30 s guard."""
    from mha_trace.models import load_model
    from mha_trace.models.guards import LIMIT_SECONDS, seconds

    sentence = " ".join(["the cat sat on the mat"] * 6)  # 36 tokens (no BOS for SmolLM2)
    result = cli("ablate", "--model", "smollm2", "--rank", "--sentence", sentence)
    check_clean(result, {2})
    model = load_model("smollm2")
    fits = max(t for t in range(1, 37) if seconds(model, t, 270) <= LIMIT_SECONDS)
    assert seconds(model, 36, 270) > LIMIT_SECONDS >= seconds(model, fits, 270)
    assert result.stderr == (
        f"Error: --sentence: Ranking every head runs SmolLM2-135M-Instruct over 270 copies of 36 "
        f"tokens: about {seconds(model, 36, 270):.0f} s on 2 cores, and the guard stops at 30 s "
        f"({fits} tokens fit); shorten the sentence, or --max-seconds "
        f"{seconds(model, 36, 270) + 1:.0f} goes on anyway\n")
    # --max-tokens is the token guard alone: it never lifts the time guard
    raised = cli("ablate", "--model", "smollm2", "--rank", "--sentence", sentence, "--max-tokens", "36")
    assert (raised.exit_code, raised.stderr) == (2, result.stderr)


def test_a_huge_fused_trace_is_refused_with_the_length_that_fits(cli):
    result = cli("shapes", "--impl", "sdpa", "--seq", "200000")
    check_clean(result, {2})
    B, H, d_k, D = 2, 8, 64, 512  # the defaults
    by_hand = lambda T: (2 * 2 * B * H * T * T * d_k + 6 * B * H * T * T  # QKᵀ, w·V, scale, softmax
                         + 4 * 2 * B * T * D * D + 4 * B * T * D)  # four projections with biases
    fits = int(result.stderr.split("(--seq ")[1].split(" fits")[0])
    assert by_hand(fits) / 70e9 <= 30 < by_hand(fits + 1) / 70e9
    assert f"this run is {by_hand(200000) / 1e9:,.0f} GFLOPs" in result.stderr
    assert cli("shapes", "--impl", "sdpa", "--seq", "200000", "--device", "meta").exit_code == 0


def test_text_views_of_long_sentences_point_to_png_and_json(cli, tmp_path):
    long = " ".join(["the cat sat on the mat"] * 10)  # 62 tokens with [CLS] and [SEP]
    for args in (("--layer", "1"), ("--head", "1.1"), ("--head", "1.1", "--format", "markdown")):
        result = cli("heads", "--model", "minilm", "--sentence", long, *args)
        check_clean(result, {2})
        assert result.stderr == ("Error: --sentence: A weights table shows up to 48 tokens and this "
                                 "sentence has 62: draw it with --png FILE, get every number with "
                                 "--format json, or shorten the sentence\n")
    data = json.loads(cli("heads", "--model", "minilm", "--sentence", long, "--head", "1.1",
                          "--format", "json").stdout)
    assert len(data["tokens"]) == 62
    png = tmp_path / "long.png"
    assert cli("heads", "--model", "minilm", "--sentence", long, "--head", "1.1", "--png",
               str(png)).exit_code == 0 and png.read_bytes()[:4] == b"\x89PNG"
    page = cli("heads", "--model", "minilm", "--sentence", " ".join(["the cat sat on"] * 40))
    check_clean(page, {2})
    assert "The overview shows up to 128 tokens and this sentence has 162" in page.stderr


@pytest.mark.slow
def test_a_tall_overview_is_one_cell_a_head_computed_from_the_weights(cli):
    """SmolLM2's 30 × 9 braille maps ran 128 lines; past 64 the overview is a line a layer, each
    head's cell its largest share (first, last, previous token, itself), over queries 1..T-1."""
    args = ("heads", "--model", "smollm2", "--sentence", "the cat sat on the mat and it ran to the "
            "dog because it was tired")
    data = json.loads(cli(*args, "--format", "json").stdout)
    T = len(data["tokens"])
    w = np.zeros((30, 9, T, T))
    for head in data["heads"]:
        w[head["layer"] - 1, head["head"] - 1] = head["weights"]
    q = np.arange(1, T)
    shares = np.stack([w[..., q, 0].mean(-1), w[..., q, T - 1].mean(-1), w[..., q, q - 1].mean(-1),
                       w[..., q, q].mean(-1)])
    for width in (80, 100, 120):
        lines = cli(*args, "--width", str(width)).stdout.splitlines()
        assert max(map(len, lines)) <= width and len(lines) < 45
        rows = [line.split() for line in lines if line[:1] == "L" and line[1:2].isdigit()]
        assert [r[0] for r in rows] == [f"L{l}" for l in range(1, 31)]
        for l, row in enumerate(rows):
            for h, cell in enumerate(row[1:]):
                k = int(shares[:, l, h].argmax())
                value = round(float(shares[k, l, h]), 2)
                assert cell[0] == ("FEPS"[k] if value >= 0.4 else "·"), (l, h, cell)
                assert float(cell[1:]) == pytest.approx(value, abs=0.006), (l, h, cell)


# 10. the model cache: every file checked by type and sha256, rebuilt when anything is off -------

JSON_VALUES = [None, 0, 1, -1, 2.5, float("nan"), "", "x", [], [1, 2], [1, 2, 3], {}, {"a": 1}, True]


@pytest.mark.parametrize("value", JSON_VALUES, ids=repr)
def test_a_damaged_verified_record_only_means_hashing_again(tmp_path, monkeypatch, value):
    from mha_trace.models import cache

    monkeypatch.setenv("MHA_TRACE_CACHE", str(tmp_path))
    weights = tmp_path / "w.bin"
    weights.write_bytes(b"weights")
    truth = hashlib.sha256(b"weights").hexdigest()
    (tmp_path / "verified.json").write_text(json.dumps(value))
    assert cache.file_sha256(weights) == truth
    (tmp_path / "verified.json").write_text(json.dumps({str(weights): value}))
    assert cache.file_sha256(weights) == truth
    record = json.loads((tmp_path / "verified.json").read_text())
    assert record[str(weights)][2] == truth  # rewritten whole


def _damages():
    """(name, what it does to meta as loaded JSON): every type in every field that matters."""
    for key in ("version", "sha256", "sizes", "tensors"):
        for value in JSON_VALUES:
            yield f"{key}={value!r}", lambda m, k=key, v=value: m.__setitem__(k, v)
    for key in ("layers", "heads", "kv_heads", "d_model", "vocab", "eos", "rope_base", "eps"):
        valid = {"eos": 0, "rope_base": 7.5, "eps": 7.5}.get(key)  # a value that is not damage
        for value in [v for v in (None, 0, -1, "8", [8], 1e308 * 10, 7.5) if v != valid]:
            yield f"sizes.{key}={value!r}", lambda m, k=key, v=value: m["sizes"].__setitem__(k, v)
    for field in ("offset", "rows", "type"):
        yield f"tensor.{field}", lambda m, f=field: m["tensors"]["blk.0.attn_q.weight"].__setitem__(f, "x")


@pytest.mark.parametrize("name,damage", list(_damages()), ids=[n for n, _ in _damages()])
@pytest.mark.slow
def test_every_damaged_cache_is_rebuilt_never_trusted(built_cache, tmp_path, name, damage):
    """Refused by its sha256, and by its types even when the sha256 is made to match."""
    import shutil

    from mha_trace.models import gguf_meta, smollm2

    folder = tmp_path / "smollm2"
    shutil.copytree(built_cache, folder)  # sound as built (checked once, in the fixture)
    size = smollm2.gguf_path().stat().st_size
    meta = json.loads((folder / "meta.json").read_text())
    damage(meta)
    (folder / "meta.json").write_text(json.dumps(meta))
    assert gguf_meta.read_meta(folder, size) is None, name
    if not name.startswith("sha256"):
        meta["sha256"] = gguf_meta.digest(meta, (folder / "tokenizer.json").read_text())
        (folder / "meta.json").write_text(json.dumps(meta))
        assert gguf_meta.read_meta(folder, size) is None, f"{name}, resealed"


@pytest.mark.slow
def test_edited_files_fail_their_sha256(built_cache, tmp_path):
    import shutil

    from mha_trace.models import gguf_meta, smollm2

    size = smollm2.gguf_path().stat().st_size
    for name, edit in (("meta.json", lambda t: t.replace('"layers": 30', '"layers": 29')),
                       ("tokenizer.json", lambda t: t.replace('"Paris"', '"Pari"', 1)),
                       ("tokenizer.json", lambda t: t[:-1]), ("meta.json", lambda t: "")):
        folder = tmp_path / f"copy-{len(list(tmp_path.iterdir()))}"
        shutil.copytree(built_cache, folder)
        (folder / name).write_text(edit((folder / name).read_text()))
        assert gguf_meta.read_meta(folder, size) is None, name


@pytest.mark.slow
def test_a_zero_layer_cache_is_rebuilt_end_to_end(cli, tmp_path, built_cache, monkeypatch,
                                                 gguf_parsed_once):
    """The case seen live: meta.json with layers 0 made predict say '␣is' with exit 0."""
    from mha_trace.models import smollm2
    from mha_trace.models.cache import file_sha256

    monkeypatch.setenv("MHA_TRACE_CACHE", str(tmp_path))
    monkeypatch.setattr(smollm2, "_loaded", None)  # loaded afresh, from this cache
    folder = tmp_path / f"smollm2-{file_sha256(smollm2.gguf_path())[:16]}"
    shutil.copytree(built_cache, folder)  # the cache a first run leaves (built once per run)
    meta_file = folder / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta["sizes"]["layers"] = 0
    meta_file.write_text(json.dumps(meta))
    (tmp_path / "verified.json").write_text("[1, 2]")
    again = cli("predict", "--top", "1", "--format", "json")
    assert again.exit_code == 0 and again.stderr == ""
    assert json.loads(again.stdout)["top"][0]["token"] == "␣Paris"
    assert json.loads(meta_file.read_text())["sizes"]["layers"] == 30
    assert not list(tmp_path.rglob("*.tmp"))


# 11. user code imported by name is protected like a file; late prints never reach the output ---

USER_CODE = {
    "ends": ("import sys\nsys.exit(0)\n", 1, "Error: importing {target} called sys.exit(0); the "
                                              "module ended itself"),
    "hard": ("import os\nos._exit(3)\n", 1, "Error: importing {target} called os._exit(3); the "
                                             "module ended itself"),
    "raises": ("raise ValueError('no')\n", 2, "Error: --module {target}: importing it raised "
                                              "ValueError: no"),
}
MODULE = """import os, threading, time
from mha_trace.core.attention import MultiHeadAttention
print("hello at import")
class Mine(MultiHeadAttention):
    def forward(self, x, mask=None):
        threading.Thread(target=lambda: (time.sleep(0.02), print("late print"))).start()
        os.write(1, b"straight to fd 1\\n")
        return super().forward(x, mask=mask)
"""


@pytest.mark.parametrize("by_name", [False, True], ids=["file", "importable"])
@pytest.mark.parametrize("kind", sorted(USER_CODE))
@pytest.mark.slow
def test_user_code_that_ends_or_raises_at_import(cli, monkeypatch, tmp_path, kind, by_name):
    """os._exit ends whatever process imports it, so that one runs in a real process."""
    source, code, message = USER_CODE[kind]
    (tmp_path / f"stu_{kind}.py").write_text(source)
    target = f"stu_{kind}" if by_name else str(tmp_path / f"stu_{kind}.py")
    args = ("shapes", "--module", f"{target}:X", "--format", "json")
    if kind == "hard":
        p = _run(*args, cwd=tmp_path, env={"PYTHONPATH": str(tmp_path)})
        returncode, stdout, stderr = p.returncode, p.stdout, p.stderr
    else:
        monkeypatch.chdir(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, f"stu_{kind}", raising=False)
        result = cli(*args)
        returncode, stdout, stderr = result.exit_code, result.stdout, result.stderr
    assert (returncode, stdout) == (code, "")
    assert stderr == message.format(target=target) + "\n"


@pytest.mark.parametrize("command,by_name", [("shapes", True), ("heads", False), ("verify", True)])
@pytest.mark.slow
def test_prints_from_threads_and_fd_1_never_reach_the_output(tmp_path, command, by_name):
    (tmp_path / "stu_mine.py").write_text(MODULE)
    target = "stu_mine" if by_name else str(tmp_path / "stu_mine.py")
    result = _run(command, "--module", f"{target}:Mine", "--format", "json", cwd=tmp_path,
                  env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    json.loads(result.stdout)  # nothing else in it
    assert "hello at import" in result.stderr and "straight to fd 1" in result.stderr
    assert "Traceback" not in result.stderr


# 12. verdicts: a student's patch to torch never reaches the reference; a flattened output is wrong

PATCHES = {  # a student's wrong "fix" to a torch function, set at import or in __init__
    "torch.softmax": "lambda x, dim=None, **k: x.exp()",
    "torch.matmul": "lambda a, b, _m=torch.matmul: _m(a, b) * 1.5",
    "torch.nn.functional.linear": "lambda x, w, b=None, _l=torch.nn.functional.linear: _l(x, w, b) + 1",
    "torch.Tensor.transpose": "lambda self, a, b, _t=torch.Tensor.transpose: _t(self, a, b) * 2",
}


@pytest.mark.parametrize("where", ["import", "init"])
@pytest.mark.parametrize("target", sorted(PATCHES))
def test_patched_torch_functions_never_reach_the_reference(cli, tmp_path, target, where):
    import torch

    before = (torch.softmax, torch.matmul, torch.nn.functional.linear, torch.Tensor.transpose)
    patch = f"{target} = {PATCHES[target]}"
    path = tmp_path / f"patch_{where}.py"
    path.write_text("import torch\nfrom mha_trace.core.attention import MultiHeadAttention\n"
                    + (patch + "\n" if where == "import" else "")
                    + "class Mine(MultiHeadAttention):\n    def __init__(self, d_model=64, heads=8):\n"
                    + "        super().__init__(d_model, heads)\n"
                    + (f"        {patch}\n" if where == "init" else ""))
    result = cli("verify", "--module", f"{path}:Mine")
    assert result.exit_code == 1 and "Wrong (exit code 1)." in result.stdout, result.stdout
    assert (torch.softmax, torch.matmul, torch.nn.functional.linear, torch.Tensor.transpose) == before
    chapter = Path(__file__).parents[1] / "examples" / "chapter_numpy_mha.py"
    assert cli("verify", "--module", f"{chapter}:MultiHeadAttention").exit_code == 0


@pytest.mark.parametrize("returned", ["out.flatten()", "out.reshape(-1, out.shape[-1])",
                                      "out.transpose(0, 1)"])
def test_an_output_of_the_wrong_shape_is_wrong_whatever_its_values(cli, tmp_path, returned):
    path = tmp_path / "shape.py"
    path.write_text("from mha_trace.core.attention import MultiHeadAttention\n"
                    "class Mine(MultiHeadAttention):\n    def __init__(self, d_model=64, heads=8):\n"
                    "        super().__init__(d_model, heads)\n"
                    "    def forward(self, x, mask=None):\n"
                    "        out, w = super().forward(x, mask=mask)\n"
                    f"        return {returned}, w\n")
    result = cli("verify", "--module", f"{path}:Mine", "--seq", "5")
    assert result.exit_code == 1 and "the lecture's has [2, 5, 64] (batch, seq, d_model)" in result.stdout


# 13. a run that fails or is stopped leaves no picture ----------------------------------------------

@pytest.mark.parametrize("sig,code,message", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                              (signal.SIGTERM, 143, "terminated (SIGTERM)")])
@pytest.mark.slow
def test_a_model_picture_set_stopped_halfway_leaves_nothing(tmp_path, sig, code, message):
    """SmolLM2's 31 figures take about half a minute on 2 cores: stopped once drawing has begun
    (matplotlib's font renderer is loaded), none of them (and no temporary file) is left."""
    run = subprocess.Popen(["mha-trace", "heads", "--model", "smollm2", "--png", str(tmp_path / "h.png")],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           preexec_fn=ctrl_c_as_a_terminal_sends_it)
    maps, deadline = Path(f"/proc/{run.pid}/maps"), time.monotonic() + 60
    while run.poll() is None and time.monotonic() < deadline and "ft2font" not in maps.read_text():
        time.sleep(0.05)  # polled, not a fixed wait: the signal comes as drawing starts
    assert run.poll() is None, "the set was finished before it could be stopped"
    run.send_signal(sig)
    _, err = run.communicate(timeout=60)
    assert (run.returncode, err) == (code, f"Error: {message}\n")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_trace_leaves_no_picture(cli, tmp_path):
    svg, html = tmp_path / "t.svg", tmp_path / "t.html"
    result = cli("shapes", "--module", "example:broken_view", "--svg", str(svg), "--html", str(html))
    assert result.exit_code == 1 and result.stderr.startswith("Error: forward raised at ")
    assert list(tmp_path.iterdir()) == []


def test_a_full_disk_halfway_through_a_picture_set_leaves_none(tmp_path, monkeypatch):
    import numpy as np

    from mha_trace.io import files

    from mha_trace.errors import MhaError
    from mha_trace.render import heatmaps

    real, calls = files.write_atomic, []

    def full_at_the_fourth(path, data, option):
        calls.append(path)
        if len(calls) == 4:
            raise MhaError(f"cannot write {path}: No space left on device", exit_code=1)
        real(path, data, option)

    monkeypatch.setattr(files, "write_atomic", full_at_the_fourth)
    with pytest.raises(MhaError, match="No space left on device"):
        heatmaps.save_model(str(tmp_path / "h.png"), "t", ["a", "b", "c"], np.full((4, 2, 3, 3), 1 / 3),
                         False)
    assert len(calls) == 4 and list(tmp_path.iterdir()) == []


# 12. what train --save may replace --------------------------------------------------------------

def _saved_run(path: Path) -> Path:
    from mha_trace.models import checkpoints, training

    checkpoints.save(training.run_training(training.Spec.of("previous-token", steps=2, snapshots=2)), str(path))
    return path


@pytest.mark.parametrize("target,make,message", [
    ("fifo.pt", os.mkfifo, "fifo.pt is not a regular file (a device, a pipe or a socket); it is never replaced"),
    ("notes.pt", lambda p: Path(p).write_text("my notes"), "notes.pt exists and is not a checkpoint of mha-trace train; it is never overwritten (give a new name)"),
    ("notes.txt", lambda p: Path(p).write_text("my notes"), "notes.txt does not end in .pt"),
    ("missing/run.pt", None, "missing/run.pt: the folder {tmp}/missing does not exist"),
    ("", None, "give a file name, e.g. --save run.pt"),
])
def test_train_save_replaces_only_its_own_checkpoints(cli, tmp_path, monkeypatch, target, make, message):
    """`train --save` never replaces a device, a pipe or a file that is not one of its own
    checkpoints, and says so before a single step is trained."""
    monkeypatch.chdir(tmp_path)
    if make:
        make(target)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    result = cli("train", "--steps", "2", "--save", target)
    check_clean(result, {2})
    assert result.stderr == f"Error: --save: {message.format(tmp=tmp_path)}\n" and result.stdout == ""
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before


def test_train_save_never_touches_dev_null(cli):
    """Run as root, the old write-then-rename swapped /dev/null for a regular file."""
    result = cli("train", "--steps", "2", "--save", "/dev/null")
    check_clean(result, {2})
    assert os.path.exists("/dev/null") and not Path("/dev/null").is_file()
    from mha_trace.errors import MhaError
    from mha_trace.io.files import write_atomic

    with pytest.raises(MhaError, match="is not a regular file"):  # the writer refuses it too
        write_atomic("/dev/null", b"checkpoint", "save")
    assert not Path("/dev/null").is_file()


@pytest.mark.slow
def test_train_save_refuses_one_path_for_two_outputs_and_overwrites_its_own(cli, tmp_path):
    run = _saved_run(tmp_path / "run.pt")
    result = cli("train", "--steps", "2", "--save", str(run), "--png", str(run))
    check_clean(result, {2})
    assert result.stderr == f"Error: --png: {run} does not end in .png\n"
    old = run.read_bytes()
    result = cli("train", "--steps", "3", "--save", str(run))
    check_clean(result, {0})
    assert run.read_bytes() != old  # its own checkpoint is replaced by the new run


def test_train_save_checks_the_folder_takes_a_file_before_training(cli, tmp_path, monkeypatch):
    """A folder that takes no new file (a read-only disk): exit 1 at once, not after the run."""
    import tempfile

    from mha_trace.models import training

    monkeypatch.setattr(training, "run_training", lambda *a, **k: pytest.fail("trained before checking"))
    real = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):
        if dir == str(tmp_path):
            raise OSError(30, "Read-only file system")
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    result = cli("train", "--steps", "2", "--save", str(tmp_path / "run.pt"))
    check_clean(result, {1})
    assert result.stderr == f"Error: --save: cannot write {tmp_path / 'run.pt'}: Read-only file system\n"


# 13. training settings, saved runs and the API: one line each, decided before any work ----------

@pytest.mark.parametrize("args,code,message", [
    (("--lr", "nan"), 2, "--lr: lr=nan is not a learning rate from 1e-06 to 1 (try 0.001)"),
    (("--seq", "4"), 2, "--seq 4 must be even and at least 6 for induction (the task uses its halves)"),
    (("--resume", ""), 2, "--resume: give the saved run to go on from, e.g. --resume run.pt"),
    (("--layers", "8", "--heads", "16", "--seq", "256", "--batch", "1024"), 1, "this training run needs about"),
])
def test_train_settings_are_refused_by_their_own_check(cli, args, code, message):
    result = cli("train", "--steps", "1", *args)
    check_clean(result, {code})
    assert result.stderr.startswith(f"Error: {message}") and result.stdout == ""


def test_the_largest_documented_seed_trains(cli):
    check_clean(cli("train", "--task", "previous-token", "--steps", "2", "--snapshots", "2",
                    "--seed", str(2 ** 64 - 1), "--format", "json"), {0})


def _damaged(good: dict, name: str) -> dict:
    import copy

    d = copy.deepcopy(good)
    if name == "format only":
        return {"format": "mha-trace train"}
    if name == "no snapshots":
        d["snapshots"] = []
    elif name in ("heads 0", "layers 5"):
        key, value = name.split()
        d["spec"][key] = int(value)
    elif name == "an unknown setting":
        d["spec"]["zzz"] = 1
    elif name == "a wrong-shaped tensor":
        state = d["snapshots"][-1]["state"]
        state[next(iter(state))] = torch_zeros((3, 3))
    elif name in ("a NaN weight", "a sparse weight"):
        state = d["state"]["model"]
        key = "blocks.0.W_q.weight"
        state[key] = state[key].clone()
        if name == "a NaN weight":
            state[key][0, 0] = float("nan")
        else:
            state[key] = state[key].to_sparse()
    elif name == "scores saved as a list":
        d["snapshots"][0]["scores"]["induction"] = d["snapshots"][0]["scores"]["induction"].tolist()
    return d


def torch_zeros(shape):
    import torch

    return torch.zeros(shape)


@pytest.mark.parametrize("name,why", [
    ("format only", "its settings are missing or not mha-trace train's"),
    ("heads 0", "its settings: heads=0 is outside 1..16"),
    ("layers 5", "weights that do not fit 5 layers of 4 heads, d_model 64"),
    ("no snapshots", "no snapshots"),
    ("an unknown setting", "its settings are missing or not mha-trace train's"),
    ("a wrong-shaped tensor", "weights that do not fit 2 layers of 4 heads, d_model 64"),
    ("a NaN weight", "its weight blocks.0.W_q.weight is not a dense tensor of finite numbers (a run "
                     "that diverged?)"),
    ("a sparse weight", "its weight blocks.0.W_q.weight is not a dense tensor of finite numbers (a "
                        "run that diverged?)"),
    ("scores saved as a list", "snapshot maps or scores that are not tensors of finite numbers"),
])
def test_well_formed_checkpoints_of_the_wrong_content_are_one_line(cli, tmp_path, name, why):
    import torch

    import mha_trace

    good = tmp_path / "good.pt"
    mha_trace.train(steps=2, snapshots=2, save=good)
    bad = tmp_path / "bad.pt"
    torch.save(_damaged(torch.load(good, weights_only=True), name), bad)
    for args, flag in ((("heads", "--checkpoint", str(bad)), "checkpoint"),
                       (("train", "--resume", str(bad), "--steps", "9"), "resume")):
        result = cli(*args)
        check_clean(result, {2})
        assert result.stderr == f"Error: --{flag}: {bad}: is a damaged checkpoint ({why})\n"
    with pytest.raises(mha_trace.MhaError, match="is a damaged checkpoint"):
        mha_trace.model(str(bad)).heads()


@pytest.mark.parametrize("call,quantity", [
    (lambda m: m.train(steps=-5), "steps"), (lambda m: m.train(steps="3"), "steps"),
    (lambda m: m.train(heads=0), "heads"), (lambda m: m.train(layers=0), "layers"),
    (lambda m: m.train(batch=0), "batch"), (lambda m: m.train(lr=float("nan")), "lr"),
    (lambda m: m.train(resume=5), "resume"), (lambda m: m.train(steps=10 ** 9), "steps"),
    (lambda m: m.train(vocab=10 ** 9), "vocab"), (lambda m: m.train(save="/dev/null"), "save"),
    (lambda m: m.model(123), "model"), (lambda m: m.model(None), "model"),
    (lambda m: m.model(b"run.pt"), "model"),
    (lambda m: m.explain(m.heads(), position=1.0), "position"),
])
def test_the_api_names_the_parameter(call, quantity):
    import mha_trace

    with pytest.raises(mha_trace.MhaError) as e:
        call(mha_trace)
    assert e.value.quantity == quantity


def test_a_trained_run_is_refused_where_text_is_needed(cli, tmp_path):
    import mha_trace

    run = tmp_path / "run.pt"
    mha_trace.train(steps=2, snapshots=2, save=run)
    with pytest.raises(mha_trace.MhaError, match="predicts its task's targets, not the next token"):
        mha_trace.model(str(run)).predict("1 2 3")
    result = cli("survey", "--checkpoint", str(run), "--induction")
    check_clean(result, {2})
    assert "has no words to repeat" in result.stderr
    result = cli("heads", "--checkpoint", str(tmp_path))
    check_clean(result, {2})
    assert result.stderr == (f"Error: --checkpoint: {tmp_path} is not a run saved by mha-trace "
                             f"train (a .pt file, e.g. --checkpoint run.pt)\n")


@pytest.mark.slow
def test_a_narrow_screen_and_a_long_decode_are_refused_with_sense(cli, tmp_path, monkeypatch):
    import mha_trace

    run = tmp_path / "run.pt"
    mha_trace.train(steps=2, snapshots=2, save=run)
    monkeypatch.setenv("COLUMNS", "1")
    result = cli("heads", "--checkpoint", str(run))
    monkeypatch.delenv("COLUMNS")
    check_clean(result, {2})
    assert "the overview needs at least 6 columns and the output has 1" in result.stderr
    for decode in ("-1", "100000"):
        result = cli("shapes", "--model", "smollm2", "--decode", decode)
        check_clean(result, {2})
        assert result.stderr == f"Error: --decode: decode={decode} must be from 1 to 1000 (every step is a block of rows)\n"


@pytest.mark.slow
def test_max_tokens_lifts_the_token_limit_never_the_memory_guard(cli, monkeypatch):
    from mha_trace.core import runtime

    monkeypatch.setattr(runtime, "available_bytes", lambda device: 100 * 2 ** 20)
    result = cli("heads", "--model", "smollm2", "--max-tokens", "400", "--sentence", "word " * 300)
    check_clean(result, {1})
    assert "of attention weights, and 100.0 MiB is free: shorten the sentence" in result.stderr


@pytest.mark.slow
def test_a_read_only_model_cache_is_only_slower(cli, monkeypatch, gguf_parsed_once):
    """HOME=/proc: no cache can be written, and SmolLM2 (loaded afresh) runs all the same."""
    from mha_trace.models import smollm2

    for key, value in {"HOME": "/proc", "MHA_TRACE_CACHE": "", "XDG_CACHE_HOME": ""}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(smollm2, "_loaded", None)
    result = cli("predict", "--top", "1", "--format", "json")
    assert result.exit_code == 0 and result.stderr == "", result.stderr
    assert json.loads(result.stdout)["top"][0]["token"] == "␣Paris"


@pytest.mark.slow
def test_a_bad_flag_with_stderr_closed_still_exits_2():
    p = subprocess.run(["mha-trace", "shapes", "--heads", "x"], stdout=subprocess.PIPE,
                       preexec_fn=lambda: os.close(2), timeout=120)
    assert p.returncode == 2 and p.stdout == b""


def test_an_output_name_too_long_is_refused_before_anything_runs(cli, tmp_path):
    name = str(tmp_path / ("a" * 252 + ".svg"))
    result = cli("shapes", "--svg", name)
    check_clean(result, {2})
    assert result.stdout == "" and "the file name is longer than the 255 bytes" in result.stderr


ODD_RESULTS = '''
import numpy as np
import torch
import torch.nn as nn


class MetaOut(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, D = x.shape
        return torch.empty(x.shape, device="meta"), torch.empty(B, 2, T, T, device="meta")


class Objects:
    def __init__(self, d_model, heads):
        pass

    def forward(self, x):
        return np.array([object()] * x.size, dtype=object).reshape(x.shape)


class Strings:
    def __init__(self, d_model, heads):
        pass

    def forward(self, x):
        return np.full(x.shape, "a")


class Ragged:
    def __init__(self, d_model, heads):
        pass

    def forward(self, x):
        return x, [np.zeros((2, 3)), np.zeros(4)]


class Property(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.W_q = nn.Linear(d_model, d_model)

    @property
    def forward(self):
        return 5
'''


@pytest.mark.parametrize("cls,code,message", [
    ("MetaOut", 1, "forward returned a tensor on the meta device, which holds no values (make new tensors on x.device)"),
    ("Objects", 1, "forward returned an array of Python objects, expected numbers"),
    ("Strings", 1, "forward returned an array of text, expected numbers"),
    ("Ragged", 1, "forward returned per-head arrays of different shapes ([2, 3], [4])"),
    ("Property", 2, "--module: Property.forward is not a method (it is a property): define it with def forward(self, x)"),
])
def test_what_a_student_forward_returns_is_checked_before_it_is_used(cli, tmp_path, cls, code, message):
    path = tmp_path / "returns.py"
    path.write_text(ODD_RESULTS)
    for command in ("shapes", "heads"):
        result = cli(command, "--module", f"{path}:{cls}", "--d-model", "8", "--heads", "2")
        check_clean(result, {code})
        assert result.stderr == f"Error: {message}\n", command


@pytest.mark.slow
def test_a_deleted_working_folder_is_one_line(tmp_path):
    gone = tmp_path / "gone"
    gone.mkdir()
    p = subprocess.run([sys.executable, "-m", "mha_trace", "shapes", "--seq", "3", "--d-model", "8",
                        "--heads", "2"], cwd=gone, preexec_fn=lambda: os.rmdir(gone), capture_output=True, text=True,
                       timeout=120)
    assert (p.returncode, p.stdout, p.stderr) == (
        1, "", "Error: the current folder no longer exists (cd to one that does)\n")


@pytest.mark.parametrize("sig,code,message", [("SIGINT", 130, "interrupted (Ctrl-C)"),
                                              ("SIGTERM", 143, "terminated (SIGTERM)")])
@pytest.mark.slow
def test_a_signal_in_the_last_moment_is_never_swallowed(sig, code, message):
    """Ctrl-C while the last bytes are written (train --save once exited 0): the signal is held
    from the start of the exit and still gives its line and code."""
    script = ("import importlib, os, signal; a = importlib.import_module('mha_trace.cli.app'); "
              "signal.signal(signal.SIGTERM, a._terminated); "
              "print('the whole output'); "
              f"signal.pthread_sigmask(signal.SIG_BLOCK, {{signal.{sig}}}); "
              f"os.kill(os.getpid(), signal.{sig}); a._exit(0)")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert (p.returncode, p.stdout, p.stderr) == (code, "the whole output\n", f"Error: {message}\n")


@pytest.mark.parametrize("flag,code,message", [("_sigterm", 143, "terminated (SIGTERM)"),
                                               ("_sigint", 130, "interrupted (Ctrl-C)")])
def test_a_signal_python_swallowed_still_stops_the_run_leaving_nothing(cli, monkeypatch, tmp_path,
                                                                       flag, code, message):
    """A signal whose exception was raised where Python ignores exceptions (a weakref's callback
    while a picture set was drawn) let the run finish and write every picture: it is stopped all
    the same, and what it wrote is removed."""
    import importlib

    app = importlib.import_module("mha_trace.cli.app")
    real = app._Group.invoke
    monkeypatch.setattr(app, flag, False)  # put back as it was, once set below
    monkeypatch.setattr(app._Group, "invoke",
                        lambda self, ctx: (real(self, ctx), setattr(app, flag, True))[0])
    result = cli("heads", "--png", str(tmp_path / "h.png"))
    assert (result.exit_code, result.stderr) == (code, f"Error: {message}\n")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("flag,code,message", [("_sigterm", 143, "terminated (SIGTERM)"),
                                               ("_sigint", 130, "interrupted (Ctrl-C)")])
def test_an_error_that_a_signal_caused_reports_the_signal(cli, monkeypatch, flag, code, message):
    """SIGTERM during matplotlib's import made it say '--png needs matplotlib' (exit 1): once a
    signal has come, what it broke is not the news."""
    import importlib

    monkeypatch.setattr(importlib.import_module("mha_trace.cli.app"), flag, True)
    result = cli("shapes", "--heads", "3")  # 512 is not divisible by 3: an error of its own
    assert (result.exit_code, result.stderr) == (code, f"Error: {message}\n")


@pytest.mark.parametrize("command", [("heads",), ("explain", "--why")])
def test_a_module_that_returns_nan_weights_is_refused_never_shown_as_agreeing(cli, command):
    result = cli(*command, "--module", "tests/student/nan_weights.py:NanAttention")
    assert (result.exit_code, result.stdout) == (1, "")
    assert result.stderr == ("Error: NanAttention from tests/student/nan_weights.py returned attention "
                             "weights that are not all numbers (NaN or inf): something in its forward "
                             "divides by zero or overflows; verify --module shows the first step that "
                             "goes wrong\n")


def test_flags_that_would_be_ignored_are_refused(cli, default_run):
    """--model beside --checkpoint in cache, --by-head with --module: refused, never dropped."""
    both = cli("cache", "--checkpoint", str(default_run), "--model", "bogus")
    assert (both.exit_code, both.stderr) == (
        2, "Error: --model and --checkpoint are two models: choose one\n")
    by_head = cli("explain", "--module", "tests/world/hf_bert.py:BertAttention", "--why", "--by-head")
    assert (by_head.exit_code, by_head.stderr) == (
        2, "Error: --by-head splits a model's earlier layers into their heads; a module's scores "
           "split into the head's dims\n")


def test_a_users_module_leaves_the_process_as_it_found_it(cli, tmp_path):
    """A module whose forward sets torch's default dtype, changes folder and takes Ctrl-C for
    itself once left all three changed in the caller's process (a notebook's, through the API):
    each is put back after the user's code has run."""
    import torch

    (tmp_path / "rude.py").write_text(
        "import os, signal, torch\nfrom mha_trace.core.attention import MultiHeadAttention\n"
        "class Rude(MultiHeadAttention):\n    def forward(self, x, mask=None):\n"
        "        torch.set_default_dtype(torch.float64)\n        os.chdir('/')\n"
        "        signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "        return super().forward(x, mask=mask)\n")
    before = (torch.get_default_dtype(), os.getcwd(), signal.getsignal(signal.SIGINT))
    result = cli("shapes", "--module", f"{tmp_path / 'rude.py'}:Rude", "--d-model", "8", "--heads", "2")
    assert result.exit_code == 0, result.stderr
    assert (torch.get_default_dtype(), os.getcwd(), signal.getsignal(signal.SIGINT)) == before


# 9. round 5: the newest surfaces (patch, --impl tiled, cost --io, RoPE planes, train --rope) ----

def strict_json(text: str):
    """JSON as a strict parser (a browser's JSON.parse) reads it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


ROUND_5 = [  # (arguments, exit code); {run} is a trained run of two layers, {one} of one head
    (("patch", "--checkpoint", "{run}", "--clean", "1 2 3 4", "--corrupt", "5 6 7 8", "--metric", "loss",
      "--sender", "1.1", "--receiver", "2.1"), 2),
    (("patch", "--checkpoint", "{run}", "--clean", "1", "--corrupt", "2", "--metric", "induction",
      "--sender", "1.1", "--receiver", "2.1"), 2),
    (("patch", "--checkpoint", "{run}", "--clean", "1", "--corrupt", "2"), 2),  # one token: no next one to score
    (("patch", "--checkpoint", "{run}", "--clean", "1 2", "--corrupt", "1 2 3"), 2),
    (("patch", "--checkpoint", "{run}", "--clean", "1 2 3 4", "--corrupt", "1 2 3 4", "--by-input"), 0),
    (("patch", "--checkpoint", "{run}", "--clean", "1 2 3 4", "--corrupt", "1 2 3 4", "--sender", "1.1",
      "--receiver", "2.1"), 0),
    (("patch", "--checkpoint", "{run}", "--metric", ""), 2),
    (("patch", "--checkpoint", "{run}", "--metric", "logit-diff:"), 2),
    (("patch", "--checkpoint", "{one}"), 0),
    (("patch", "--checkpoint", "{one}", "--by-input", "--by-position", "1.1"), 0),
    (("survey", "--checkpoint", "{rope}", "--rope-planes"), 0),
    (("explain", "--checkpoint", "{rope}", "--rope-planes"), 0),
    (("cost", "--io", "--causal", "--seq", "2147483647", "--block-q", "1", "--block-k", "1", "--backward"), 0),
    (("cost", "--io", "--sram", "9" * 400), 2),
    (("cost", "--io", "--block-q", "0"), 2), (("cost", "--io", "--block-k", "-1"), 2),
    (("cost", "--io", "--block-q", "1000000000", "--block-k", "1000000000"), 0),
    (("cost", "--io", "--dropout", "nan"), 2), (("cost", "--block-q", "2"), 2), (("cost", "--backward"), 2),
    (("explain", "--impl", "tiled", "--block-k", "0"), 2), (("explain", "--impl", "tiled", "--block-k", "-1"), 2),
    (("explain", "--impl", "tiled", "--block-k", "1000000000"), 0),
    (("shapes", "--impl", "tiled", "--block-q", "1000000000"), 0),
    (("shapes", "--impl", "tiled", "--seq", "64", "--block-q", "1", "--block-k", "1"), 2),
    (("train", "--rope", "--d-model", "4", "--heads", "4"), 2), (("train", "--rope", "--d-model", "10", "--heads", "2"), 2),
    (("shapes", "--rope", "--d-model", "12", "--heads", "4"), 2),
    (("verify", "--module", "example:chapter_torch", "--d-model", "8", "--heads", "2", "--mask", "causal",
      "--mask-means", "keep"), 1),  # its inverted mask leaves a row with no key: NaN, said in words
]


@pytest.fixture(scope="module")
def small_runs(tmp_path_factory):
    """A run of one layer of one head, and one of RoPE with d_k = 2 (one plane a head)."""
    import mha_trace

    folder = tmp_path_factory.mktemp("round5")
    mha_trace.train("induction", layers=1, heads=1, d_model=16, steps=3, snapshots=2, save=str(folder / "one.pt"))
    mha_trace.train("induction", layers=1, heads=4, d_model=8, rope=True, steps=3, snapshots=2,
                    save=str(folder / "rope.pt"))
    return folder


@pytest.mark.parametrize("args,code", ROUND_5, ids=lambda a: " ".join(a)[:60] if isinstance(a, tuple) else str(a))
def test_round_5_ends_in_one_line_or_a_clean_run_with_strict_json(cli, default_run, small_runs, args, code):
    """Each case of round 5 (an internal error, a NaN shown, invalid JSON, a silent acceptance or a
    hang before): exit 2 with one Error line, or a run whose JSON a strict parser reads, with no
    NaN or infinity written anywhere in its text."""
    args = [a.format(run=default_run, one=small_runs / "one.pt", rope=small_runs / "rope.pt") for a in args]
    result = cli(*args, "--format", "json")
    check_clean(result)
    assert result.exit_code == code, result.stderr
    if code != 2:
        strict_json(result.stdout)
        text = cli(*args).stdout
        assert not re.search(r"\bnan\b|(?<![-\"'])\binf\b", text), text  # as Python prints them; −inf: masked
