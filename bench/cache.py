"""The KV-cache lab's time: `mha-trace cache` with its defaults (512 tokens of the bundled corpus;
full, window, sinks and h2o at budgets 64, 128 and 256), as a ratio to `python -c "import torch"`,
the two alternated.

    python bench/cache.py [--rounds N] [--device cuda]

About 25 s a round on two cores (the release before took 8.4 s on an H200). docs/cache.md and docs/testing.md quote it.
"""

import argparse
import statistics
import subprocess
import sys
import time


def timed(args: list) -> float:
    start = time.perf_counter()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    o = parser.parse_args()
    rounds = o.rounds
    lab, torch = [], []
    for _ in range(rounds):
        torch.append(timed([sys.executable, "-c", "import torch"]))
        lab.append(timed([sys.executable, "-m", "mha_trace", "cache", "--device", o.device,
                          "--format", "json"]))
        torch.append(timed([sys.executable, "-c", "import torch"]))
    t, c = statistics.median(torch), statistics.median(lab)
    print(f"import torch {t:.2f} s; cache (defaults, {o.device}) {c:.1f} s = {c / t:.0f}x import torch "
          f"({rounds} round{'s' if rounds > 1 else ''}, medians)")


if __name__ == "__main__":
    main()
