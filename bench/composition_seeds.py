"""What docs/why.md says of composition in the default training run, over seeds 0-4.

    python bench/composition_seeds.py

For each seed: `mha-trace train` with its defaults (one thread, as the command runs; saved to
a temporary file), then on the saved
run, as `survey --checkpoint RUN --composition` and `ablate --checkpoint RUN --head L.H` compute
them: the induction heads (over half their weight on the token after an earlier copy, on the run's
probe), each one's strongest K-composition partner, whether that partner is a previous-token head,
and each induction head's score with its partner removed. About 45 seconds on two cores.
"""

import tempfile
from pathlib import Path

import numpy as np
import torch

import mha_trace
from mha_trace.analyses.composition import composition, probe_roles

SEEDS = range(5)


def one(seed: int, folder: Path) -> list[str]:
    path = folder / f"seed{seed}.pt"
    mha_trace.train("induction", seed=seed, save=str(path))
    model = mha_trace.model(str(path)).model
    c = composition(model)
    base, rows = float(c.baseline.mean()), []
    for head in c.with_role("induction"):
        partner, score = c.partner("K", head)
        without = probe_roles(model, {partner[0]: [(None, partner[1])]})["induction"]
        before = c.roles["induction"][head[0] - 1, head[1] - 1]
        rows.append(f"| {seed} | {head[0]}.{head[1]} | {partner[0]}.{partner[1]} | "
                    f"{score:.3f} ({score / base:.1f}×) | "
                    f"{'yes' if partner in c.with_role('previous token') else 'no'} | "
                    f"{before:.2f} → {without[head[0] - 1, head[1] - 1]:.2f} |")
    return rows or [f"| {seed} | none | | | | |"]


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    torch.set_num_threads(1)  # as `mha-trace train` runs: the same weights to the last bit
    print("| seed | induction head | strongest K partner | K-composition | previous-token head? "
          "| induction score → without the partner |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for seed in SEEDS:
            print("\n".join(one(seed, Path(folder))), flush=True)
