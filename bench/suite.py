"""The suite's time as a ratio to `python -c "import torch"`, the two alternated in one run.

The suite is CPU-bound, and a shared 2-core machine runs it in anything from 180 s to 260 s within
one day: its seconds alone cannot say whether a change made it faster. Each round times the torch
import three times (the median), then the README's test command, then the import three times
again, and prints the suite's seconds, its ratio to the round's import, and the cores' busy and
idle seconds (from /proc/stat, on Linux) while it ran. Not a test: run it by hand, from the
repository's root, and compare two commits' ratios in the same hour.

    python bench/suite.py              # 1 round
    python bench/suite.py --rounds 2

The target the issues set, 2.5 minutes on 2 cores, is in seconds: it is printed beside the ratio
(150 s is 100 times an import of 1.5 s).
"""

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

TARGET_S = 150.0
SUITE = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]  # the README's, no cache


def timed(command: list) -> tuple[float, int]:
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, done.returncode


def cores() -> tuple[int, int] | None:
    """(busy, idle) ticks of every core so far (user, nice, system; idle, iowait), or None."""
    stat = Path("/proc/stat")
    if not stat.exists():
        return None
    user, nice, system, idle, iowait = map(int, stat.read_text().split()[1:6])
    return user + nice + system, idle + iowait


def one_round(i: int) -> float:
    imports = [timed([sys.executable, "-c", "import torch"])[0] for _ in range(3)]
    before = cores()
    seconds, rc = timed(SUITE)
    after = cores()
    imports += [timed([sys.executable, "-c", "import torch"])[0] for _ in range(3)]
    torch_s = statistics.median(imports)
    line = (f"round {i}: suite {seconds:.1f} s (exit {rc}), import torch {torch_s:.2f} s, "
            f"ratio {seconds / torch_s:.0f} (the target {TARGET_S:.0f} s: {TARGET_S / torch_s:.0f})")
    if before and after:
        busy, idle = ((a - b) / 100 for a, b in zip(after, before))  # USER_HZ ticks
        line += f"; cores busy {busy:.0f} s, idle {idle:.0f} s"
    print(line, flush=True)
    return seconds / torch_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="suite runs (each about 4 minutes)")
    ratios = [one_round(i + 1) for i in range(parser.parse_args().rounds)]
    print(f"median ratio {statistics.median(ratios):.0f}")


if __name__ == "__main__":
    main()
