"""How long each explorer interaction takes as a lecturer sees it: `mha-trace explore` runs in an
80×24 pseudo-terminal; for each key, the time from writing the key until the first byte of the
redraw it caused (the answer appears) and until the last (the screen is quiet for 0.15 s after
it). For every bundled config and MiniLM. The issue's target: every interaction within 100 ms.
Not a test: run it by hand.

    python bench/explore.py
"""

import fcntl
import os
import pty
import select
import shutil
import statistics
import struct
import sys
import termios
import time

QUIET = 0.15
KEYS = {  # pressed in this order, pane by pane (escape sequences for the arrows)
    "config": ["\x1b[B", "\x1b[B", "2", "\x1b[C", "\x1b[B", "]", "m", "m", "m", "+", "-", "3", "t",
               "T", "4", "+", "-", "5", " ", " ", "a", "1", "d"],
    "model": ["\x1b[B", "2", "\x1b[C", "\x1b[B", "]", ">", "<", "3", "t", "4", "5", " ", "]", " ",
              "a", "1", "d"],
}
NAMES = {"\x1b[B": "down", "\x1b[C": "right", " ": "space"}


def _drain(fd, until_quiet: float) -> tuple[float | None, float | None]:
    """Read until the terminal is quiet for `until_quiet` s: the times of the first and last
    bytes read."""
    first = last = None
    while select.select([fd], [], [], until_quiet)[0]:
        try:
            if not os.read(fd, 65536):
                break
        except OSError:
            break
        last = time.perf_counter()
        first = first or last
    return first, last


def measure(args: list, keys: list) -> list[tuple[str, float, float]]:
    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.execvp(args[0], args)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    _drain(fd, 3.0)  # the first screen, drawn once torch and the run are loaded
    timings = []
    for key in keys:
        start = time.perf_counter()
        os.write(fd, key.encode())
        first, last = _drain(fd, QUIET)
        timings.append((NAMES.get(key, key), (first or start) - start, (last or start) - start))
    os.write(fd, b"q")
    _drain(fd, 1.0)
    os.waitpid(pid, 0)
    return timings


def main():
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from mha_trace.runs.config import bundled_names

    exe = shutil.which("mha-trace")
    cli = [exe] if exe else [sys.executable, "-m", "mha_trace"]
    runs = {name: (cli + ["explore", "--config", name], KEYS["config"]) for name in bundled_names()}
    runs["minilm"] = (cli + ["explore", "--model", "minilm"], KEYS["model"])
    print(f"{'':23} {'answer appears, ms':>24}   {'screen settled, ms':>24}")
    print(f"{'source':18} {'keys':>4} {'median':>8} {'max':>6} {'key':>8}   {'median':>8} {'max':>6} "
          f"{'key':>8}")
    for name, (args, keys) in runs.items():
        timings = measure(args, keys)
        row = f"{name:18} {len(timings):4}"
        for i in (1, 2):
            ms = [t[i] * 1000 for t in timings]
            slowest = max(timings, key=lambda t: t[i])[0]
            row += f" {statistics.median(ms):8.1f} {max(ms):6.1f} {slowest:>8}  "
        print(row)


if __name__ == "__main__":
    main()
