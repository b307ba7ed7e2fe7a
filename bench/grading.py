"""A whole class verified at once: 200 submissions (40 right, 160 with one of four classic mistakes,
made from tests/classroom/skeleton.py) on 2 cores, against `python -c "import torch"` in the same,
alternated run. The verify issue's target: 200 submissions in at most 2 minutes on 2 cores. Not a
test: run it by hand.

    python bench/grading.py             # 3 rounds
    python bench/grading.py --rounds 1
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SKELETON = (Path(__file__).resolve().parent.parent / "tests" / "classroom" / "skeleton.py").read_text()
MISTAKES = ("", "/ math.sqrt(D)|/ D", "attn_mask == 0|attn_mask == 1", "dim=-1|dim=-2",
            "(attn @ v).transpose(1, 2).reshape|(attn @ v).reshape")


def build(folder: Path, n: int = 200) -> None:
    for i in range(n):
        mistake = MISTAKES[i % len(MISTAKES)]
        text = SKELETON.replace(*mistake.split("|")) if mistake else SKELETON
        (folder / f"student_{i:03d}.py").write_text(text)


def timed(cmd: list) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    rounds = parser.parse_args().rounds
    two = ["taskset", "-c", ",".join(map(str, sorted(os.sched_getaffinity(0))[:2]))]
    with tempfile.TemporaryDirectory() as folder:
        build(Path(folder))
        cmds = {"import torch": two + [sys.executable, "-c", "import torch"],
                "verify 200 submissions (--jobs 2)": two + [sys.executable, "-m", "mha_trace", "verify", "--module",
                                                            f"{folder}:MultiHeadAttention", "--course", "cs231n",
                                                            "--jobs", "2", "--format", "json"]}
        times = {name: [] for name in cmds}
        for _ in range(rounds):
            for name, cmd in cmds.items():
                times[name].append(timed(cmd))
    torch = statistics.median(times["import torch"])
    for name, values in times.items():
        wall = statistics.median(values)
        print(f"{name:40s} {wall:7.2f} s  {wall / torch:6.2f}× import torch")
    print(f"target: 200 submissions in at most 120 s on 2 cores, {120 / torch:.1f}× import torch here")


if __name__ == "__main__":
    main()
