"""The claims docs/train.md makes about training, measured over seeds 0-4 (not one example).

    python bench/train_seeds.py

Prints, for each seed: the difference task's final held-out loss with distinct and with identical
heads and each distinct head's weight on the previous token and two back; and for the default
induction run, the step its first previous-token head and its first induction head form (over half
their weight there). About a minute on two cores. docs/train.md quotes its ranges.
"""

import numpy as np

from mha_trace.models.training import Spec, run_training

SEEDS = range(5)


def difference(seed: int) -> None:
    runs = {same: run_training(Spec.of("difference", steps=700, snapshots=4, seed=seed,
                                       identical_heads=same)) for same in (False, True)}
    last = runs[False].snapshots[-1]
    heads = "  ".join(f"1.{h + 1} prev {last.scores['previous token'][0, h]:.2f} two back "
                      f"{last.scores['two back'][0, h]:.2f}" for h in range(runs[False].spec.heads))
    print(f"difference seed {seed}: distinct {last.loss:.2f} nats, identical "
          f"{runs[True].snapshots[-1].loss:.2f}; {heads}")


def induction(seed: int) -> None:
    r = run_training(Spec.of("induction", seed=seed))
    first = {name: min(r.formed(name).values(), default=None)
             for name in ("previous token", "induction")}
    print(f"induction seed {seed}: previous-token head formed at step {first['previous token']}, "
          f"induction head at {first['induction']}; final loss {r.snapshots[-1].loss:.2f}")


if __name__ == "__main__":
    np.set_printoptions(precision=2)
    for seed in SEEDS:
        difference(seed)
    for seed in SEEDS:
        induction(seed)
