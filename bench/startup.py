"""Start-up and meta-trace cost, as ratios to `python -c "import torch"` measured in the same run.

Each command runs as a whole process; the commands are alternated round by round so that a noisy,
shared machine slows them all alike. Prints the median wall time, the peak RSS, and both as ratios
to the torch import. Not a test: run it by hand.

    python bench/startup.py            # 7 rounds
    python bench/startup.py --rounds 15
    python bench/startup.py --no-speedups-too   # each command also with MHA_TRACE_NO_SPEEDUPS=1
    python bench/startup.py --rounds 1 --slow   # also ablate --prune (about 45 seconds a run)

Targets from the issues in seconds are ratios here too: `ablate --rank` on SmolLM2 ≤ 8 s is
≤ 8 / 1.6 (the torch import here), `--prune` ≤ 30 (it was 2 minutes, ≤ 120 / 1.6), the default `train`
≤ 20 s ≤ 20 / 1.6; the corpus survey of
MiniLM ≤ 3× one `heads --model minilm` is printed as its own ratio.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TARGETS = {  # name: (wall ratio, peak-RSS ratio) targets from the issues; None where none is set
    "mha-trace --help": (0.1, None),
    "mha-trace shapes": (0.85, None),
    "mha-trace shapes (GPT-3, meta)": (1.0, 1.4),
    "mha-trace shapes --d-model 7 --heads 2 (refused)": (0.3, None),
    "mha-trace explain --heads 3 (refused)": (0.3, None),
    "mha-trace explain --token nosuch (refused)": (0.3, None),
    "mha-trace heads --model minilm --head 6.13 (refused)": (0.3, None),
    "mha-trace cost --preset gpt3-175b": (0.25, None),
    "mha-trace cost --preset gpt2-medium --io --backward": (0.25, None),  # arithmetic, like cost
    "mha-trace heads --model minilm": (1.0, 1.4),
    "mha-trace survey --model minilm": (None, None),  # ≤ 3× heads --model minilm: printed below
    "mha-trace explain --model minilm (layer 6) --png": (1.5, None),
    "mha-trace heads --model smollm2 (first run)": (4.0, None),
    "mha-trace heads --model smollm2": (1.6, 2.0),
    "mha-trace survey --model smollm2 --induction": (6.0, None),
    "mha-trace ablate --model smollm2 --rank": (8 / 1.6, None),
    "mha-trace ablate --model smollm2 --prune": (30, None),  # "Fast enough to run live"
    "mha-trace train (induction, the default run)": (20 / 1.6, None),
    "mha-trace explore (first screen)": (1.3, None),
}
REFUSED = {("shapes", "--d-model", "7", "--heads", "2"), ("explain", "--heads", "3"),
           ("explain", "--token", "nosuch"), ("heads", "--model", "minilm", "--head", "6.13")}  # exit 2
FIRST_SCREEN = b"self.W_q(q)"  # the trace pane's first rows: the explorer's first screen is up


def commands(slow: bool = False) -> dict:
    exe = shutil.which("mha-trace")
    cli = [exe] if exe else [sys.executable, "-m", "mha_trace"]
    gpt3 = ["--device", "meta", "--batch", "1", "--seq", "2048", "--d-model", "12288",
            "--heads", "96"]
    cmds = {
        "import torch": [sys.executable, "-c", "import torch"],
        "mha-trace --help": cli + ["--help"],
        "mha-trace shapes": cli + ["shapes"],
        "mha-trace shapes (GPT-3, meta)": cli + ["shapes", *gpt3],
        "mha-trace shapes --d-model 7 --heads 2 (refused)": cli + ["shapes", "--d-model", "7", "--heads", "2"],
        "mha-trace explain --heads 3 (refused)": cli + ["explain", "--heads", "3"],
        "mha-trace explain --token nosuch (refused)": cli + ["explain", "--token", "nosuch"],
        "mha-trace heads --model minilm --head 6.13 (refused)": cli + ["heads", "--model", "minilm", "--head", "6.13"],
        "mha-trace shapes --impl tiled": cli + ["shapes", "--impl", "tiled"],
        "mha-trace explain --token sat --impl tiled": cli + ["explain", "--token", "sat", "--impl", "tiled"],
    }
    if subprocess.run(cli + ["cost", "--help"], capture_output=True).returncode == 0:
        cmds["mha-trace cost --preset gpt3-175b"] = cli + ["cost", "--preset", "gpt3-175b"]
        cmds["mha-trace cost --preset gpt2-medium --io --backward"] = cli + [
            "cost", "--preset", "gpt2-medium", "--batch", "64", "--dtype", "float16", "--io", "--backward"]
    sentence = "The animal didn't cross the street because it was too tired."
    if subprocess.run(cli + ["heads", "--model", "minilm", "--head", "1.1"], capture_output=True).returncode == 0:
        cmds["mha-trace heads --model minilm"] = cli + ["heads", "--model", "minilm", "--sentence", sentence]
        cmds["mha-trace survey --model minilm"] = cli + ["survey", "--model", "minilm"]
        explain = cli + ["explain", "--model", "minilm", "--sentence", sentence, "--token", "it", "--layer", "6"]
        cmds["mha-trace explain --model minilm (layer 6)"] = explain
        cmds["mha-trace explain --model minilm (layer 6) --why"] = explain + ["--why"]
        cmds["mha-trace explain --model minilm (layer 6) --png"] = explain + [
            "--png", os.path.join(tempfile.gettempdir(), "mha-trace-bench-explain.png")]
        cmds["mha-trace heads --model minilm --png (overview and 6 layers)"] = cli + [
            "heads", "--model", "minilm", "--sentence", sentence, "--png",
            os.path.join(tempfile.gettempdir(), "mha-trace-bench-heads.png")]
        cmds["mha-trace survey --model minilm --effect"] = cli + ["survey", "--model", "minilm", "--effect"]
    if subprocess.run(cli + ["predict", "--top", "1"], capture_output=True).returncode == 0:
        heads = cli + ["heads", "--model", "smollm2", "--sentence", sentence]
        # the first run parses the GGUF and fills an empty cache (a fresh folder every time)
        cmds["mha-trace heads --model smollm2 (first run)"] = ["env", "MHA_TRACE_CACHE=FRESH"] + heads
        cmds["mha-trace heads --model smollm2"] = heads
        cmds["mha-trace survey --model smollm2 --induction"] = cli + ["survey", "--model", "smollm2",
                                                                      "--induction"]
        cmds["mha-trace survey --model smollm2"] = cli + ["survey", "--model", "smollm2"]
        cmds["mha-trace survey --model smollm2 --effect"] = cli + ["survey", "--model", "smollm2", "--effect"]
        cmds["mha-trace survey --model smollm2 --composition"] = cli + ["survey", "--model", "smollm2",
                                                                       "--composition"]
        cmds["mha-trace survey --model smollm2 --rope-planes"] = cli + ["survey", "--model", "smollm2",
                                                                       "--rope-planes"]
        cmds["mha-trace ablate --model smollm2 --rank"] = cli + ["ablate", "--model", "smollm2",
                                                                 "--sentence", sentence, "--rank"]
        cmds["mha-trace patch --model smollm2 (the indirect object)"] = cli + ["patch", "--model", "smollm2"]
        if slow:
            cmds["mha-trace ablate --model smollm2 --prune"] = cli + ["ablate", "--model", "smollm2",
                                                                      "--prune"]
    clip = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "audio", "animal.wav")
    if subprocess.run(cli + ["survey", "--model", "whisper", "--audio", clip], capture_output=True).returncode == 0:
        cmds["mha-trace survey --model whisper --audio animal.wav --timestamps"] = cli + [
            "survey", "--model", "whisper", "--audio", clip, "--timestamps"]
        cmds["mha-trace explain --model whisper --audio animal.wav --token street"] = cli + [
            "explain", "--model", "whisper", "--audio", clip, "--token", "street"]
        cmds["mha-trace heads --model whisper --audio animal.wav (every cross head)"] = cli + [
            "heads", "--model", "whisper", "--audio", clip]
        cmds["mha-trace explain --model whisper ... --token street --head 4.3 --why"] = cli + [
            "explain", "--model", "whisper", "--audio", clip, "--token", "street", "--head", "4.3", "--why"]
        cmds["mha-trace heads --model whisper ... --attention encoder"] = cli + [
            "heads", "--model", "whisper", "--audio", clip, "--attention", "encoder"]
        cmds["mha-trace explain --model whisper ... --attention self --head 2.3 --why"] = cli + [
            "explain", "--model", "whisper", "--audio", clip, "--attention", "self", "--head", "2.3", "--why"]
    cmds["mha-trace train (induction, the default run)"] = cli + ["train"]
    cmds["mha-trace explore (first screen)"] = ["PTY"] + cli + ["explore"]
    return cmds


def first_screen(cmd: list) -> tuple[float, int]:
    """Seconds until the explorer, in an 80×24 pseudo-terminal, has drawn its first screen (then
    q quits it), and the peak RSS of the whole process."""
    import fcntl
    import pty
    import select
    import struct
    import termios

    start = time.perf_counter()
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
        os.execvp(cmd[0], cmd)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    seen, wall = b"", None
    while True:
        if select.select([fd], [], [], 0.01)[0]:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
            if wall is None and FIRST_SCREEN in seen:
                wall = time.perf_counter() - start
                os.write(fd, b"q")
    _, status, usage = os.wait4(pid, 0)
    if wall is None or os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_maxrss * 1024


def run_once(cmd: list) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one whole process."""
    if cmd[0] == "PTY":
        return first_screen(cmd[1:])
    if "MHA_TRACE_CACHE=FRESH" in cmd:  # an empty cache folder, made outside the timing
        cmd = [c if c != "MHA_TRACE_CACHE=FRESH" else f"MHA_TRACE_CACHE={tempfile.mkdtemp()}"
               for c in cmd]
    start = time.perf_counter()
    # bytecode is written once (the warm-up round) and then used, as an installed package's is
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**env, "NO_COLOR": "1"})
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    expected = 2 if tuple(cmd[1:]) in REFUSED else 0  # a refused command's exit code is 2
    if os.waitstatus_to_exitcode(status) != expected:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_maxrss * 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--no-speedups-too", action="store_true",
                        help="also run each command with MHA_TRACE_NO_SPEEDUPS=1, in the same rounds")
    parser.add_argument("--slow", action="store_true", help="also ablate --model smollm2 --prune")
    args = parser.parse_args()
    rounds, cmds = args.rounds, commands(args.slow)
    if args.no_speedups_too:
        off = ["env", "MHA_TRACE_NO_SPEEDUPS=1"]
        cmds.update({f"{name} [off]": ["PTY", *off, *cmd[1:]] if cmd[0] == "PTY" else off + cmd
                     for name, cmd in list(cmds.items()) if name != "import torch"})
    walls = {name: [] for name in cmds}
    rss = {name: [] for name in cmds}
    for cmd in cmds.values():  # warm the file cache once
        run_once(cmd)
    for _ in range(rounds):
        for name, cmd in cmds.items():
            w, m = run_once(cmd)
            walls[name].append(w)
            rss[name].append(m)
    base_w = statistics.median(walls["import torch"])
    base_m = statistics.median(rss["import torch"])
    print(f"{rounds} rounds, medians; ratios are to `python -c 'import torch'`\n")
    print(f"{'command':44} {'wall s':>7} {'ratio':>6} {'target':>7}   {'RSS MiB':>8} {'ratio':>6} {'target':>7}")
    for name in cmds:
        w, m = statistics.median(walls[name]), statistics.median(rss[name])
        tw, tm = TARGETS.get(name.removesuffix(" [off]"), (None, None))
        fmt = lambda t: f"≤{t:.2f}" if t else ""
        print(f"{name:44} {w:7.3f} {w / base_w:6.2f} {fmt(tw):>7}   {m / 2**20:8.0f} "
              f"{m / base_m:6.2f} {fmt(tm):>7}")
    pair = ("mha-trace survey --model minilm", "mha-trace heads --model minilm")
    if all(name in walls for name in pair):
        a, b = (statistics.median(walls[name]) for name in pair)
        print(f"\nthe MiniLM corpus survey is {a / b:.2f}× one heads --model minilm (target ≤ 3)")


if __name__ == "__main__":
    main()
