"""The induction circuit over seeds 0-4 of the default training run, proved by path patching.

    python bench/patching_seeds.py

For each seed: `mha-trace train` with its defaults (one thread, as the command trains), then, as
`survey --checkpoint RUN --composition` and `patch --checkpoint RUN --sender 1.S --receiver 2.R`
compute them: each induction head's strongest K-composition partner, and for every layer-1 head
the share of the receiver's induction score gap its output restores through the receiver's
queries, keys and values (the probe's first half re-drawn as the corrupted run). Prints whether
the sender that restores most through the keys is composition's partner, and what every layer-1
head restores through the keys together (`--sender 1.1,1.2,1.3,1.4`). About a minute on two cores.
"""

import tempfile
from pathlib import Path

import torch

import mha_trace
from mha_trace.analyses.composition import composition
from mha_trace.analyses.patch_inputs import default_pair, parse_metric
from mha_trace.analyses.path_patching import path_patch

SEEDS = range(5)


def one(seed: int, folder: Path) -> list[str]:
    path = folder / f"seed{seed}.pt"
    mha_trace.train("induction", seed=seed, save=str(path))
    model = mha_trace.model(str(path)).model
    found = composition(model)
    clean, corrupt, metric = default_pair(model, path=True)
    rows = []
    for head in found.with_role("induction"):
        partner, _ = found.partner("K", head)
        shares = {s: path_patch(model, clean, corrupt, parse_metric(model, metric), [(1, s)], tuple(head))
                  for s in range(1, model.heads + 1)}
        every = path_patch(model, clean, corrupt, parse_metric(model, metric),
                           [(1, s) for s in range(1, model.heads + 1)], tuple(head))
        fraction = {s: {k: p.fraction(v) for k, v in p.via.items()} for s, p in shares.items()}
        best = max(fraction, key=lambda s: fraction[s]["k"])
        rows.append(f"seed {seed}  induction head {head[0]}.{head[1]}: composition's K partner "
                    f"{partner[0]}.{partner[1]}, path patching's 1.{best} "
                    f"({'same' if (1, best) == tuple(partner) else 'DIFFERENT'}); through K "
                    f"{fraction[best]['k']:.0%}, Q {fraction[best]['q']:+.0%}, V {fraction[best]['v']:+.0%}; "
                    f"every layer-1 head together through K {every.fraction(every.via['k']):.0%}")
    return rows


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        for seed in SEEDS:
            for row in one(seed, Path(folder)):
                print(row)


if __name__ == "__main__":
    main()
