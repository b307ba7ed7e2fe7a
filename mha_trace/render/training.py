"""Render `train`: the loss as training goes, and when each head became what it is."""

import numpy as np
from rich.text import Text

from mha_trace.io.output import new_table
from mha_trace.io.page import notebook_figure
from mha_trace.records import data, renderables
from mha_trace.render.matrices import shade
from mha_trace.models.spec import TASKS
from mha_trace.models.training import Training
from mha_trace.core.head import Head

DETECTORS = ("previous token", "two back", "induction")


def _best(scores: np.ndarray) -> tuple[int, int, float]:
    l, h = np.unravel_index(int(np.argmax(scores)), scores.shape)
    return int(l) + 1, int(h) + 1, float(scores[l, h])


def formed_lines(r: Training) -> list[str]:
    lines = []
    for name in DETECTORS:
        found = r.formed(name)
        if found:
            heads = ", ".join(f"{Head(l, h)} at step {step}" for (l, h), step in sorted(found.items(),
                                                                                 key=lambda x: x[1]))
            lines.append(f"{name.capitalize()} heads (over half their weight there): {heads}.")
    return lines or ["No head gives over half its weight to the previous token, two back or the "
                     "token after an earlier copy."]


def identical_lines(r: Training) -> list[str]:
    """Exercise 3: whether the heads stayed the same, and why."""
    spread = r.spread()
    if r.spec.identical_heads:
        stayed = "are still equal to the last bit" if r.identical() else "did NOT stay equal"
        return [f"Every layer's heads started with the same weights and {stayed} at every "
                f"snapshot. Why: equal heads see the same input and make the same outputs, so the "
                f"loss's gradient is the same for each of them, and so is every update: nothing can "
                f"ever tell them apart. Two equal heads are one head computed twice."]
    lines = []
    for l in range(r.spec.layers):
        start, end = spread[0, l], spread[-1, l]
        parted = next((snap.step for snap, x in zip(r.snapshots, spread[:, l]) if x > 2 * start),
                      None)
        when = "" if parted is None else f"; twice as far apart as at the start by step {parted}"
        lines.append(f"Layer {l + 1}: its two most different heads disagree on {start:.0%} of a "
                     f"query's weight at the start and {end:.0%} at the end{when}.")
    return lines + ["(Disagree: half the summed difference of two heads' weights in a query's row, "
                    "averaged over the queries; 0% is two heads that look at the same places.)"]


def training_renderables(r: Training) -> list:
    s = r.spec
    out = [Text(f"train: {s.task} ({TASKS[s.task]}), {s.layers} layer{'s' * (s.layers > 1)} × "
                f"{s.heads} heads, d_model {s.d_model}, vocabulary {s.vocab}, {s.seq} tokens a "
                f"sequence, {s.steps} steps of {s.batch} (seed {s.seed}"
                f"{', identical heads' if s.identical_heads else ''})", style="bold")]
    table = new_table(f"Snapshots: the held-out loss (chance: ln {s.vocab} = {r.chance:.2f}) and "
                      f"the best head per detector on the probe")
    table.add_column("step", justify="right")
    table.add_column("loss", justify="right")
    for name in DETECTORS:
        table.add_column(name, justify="right")
    for snap in r.snapshots:
        cells = []
        for name in DETECTORS:
            l, h, x = _best(snap.scores[name])
            cells.append(Text(f"{Head(l, h)} {x:.2f}", style=shade(x)))
        table.add_row(str(snap.step), f"{snap.loss:.3f}", *cells)
    out.append(table)
    out.append(Text("Each detector's column: the head that gives that place the most weight, and "
                    "the weight (previous token: the token just before the query; two back: the "
                    "one before that; induction: the token after an earlier copy of the query)."))
    out.append(Text("\n".join(formed_lines(r) + partner_lines(r) + identical_lines(r))))
    return out


def partner_lines(r: Training) -> list[str]:
    """Each induction head's strongest K-composition partner (Elhage et al. 2021), snapshot by
    snapshot: the earlier head whose output its keys read most."""
    from mha_trace.core.composition import random_baseline

    partners = r.k_partners()
    if not partners:
        return []
    base = float(random_baseline(r.spec.d_model, r.spec.d_model // r.spec.heads).mean())
    previous = r.formed("previous token")
    lines = []
    for (l, h), trail in partners.items():
        runs = []  # (partner, first step) each time the partner changes
        for step, partner, _ in trail:
            if not runs or runs[-1][0] != partner:
                runs.append((partner, step))
        said = ", ".join(f"{Head(a, b)} from step {step}" for (a, b), step in runs)
        (a, b), score = trail[-1][1], trail[-1][2]
        kind = "a previous-token head" if (a, b) in previous else "not a previous-token head"
        lines.append(f"Induction head {Head(l, h)}'s strongest K-composition partner (the earlier "
                     f"head its keys read most): {said}; at the end {score:.3f}, "
                     f"{score / base:.1f}× random matrices, {kind}.")
    return lines + ["(ablate --checkpoint RUN --head L.H shows how far the induction scores fall "
                    "without a partner.)"]


def training_data(r: Training) -> dict:
    s = r.spec
    grid = lambda a: [[round(float(x), 6) for x in row] for row in a]
    return {"command": "train", "spec": dict(s.__dict__), "chance": round(r.chance, 6),
            "losses": [round(x, 6) for x in r.losses],
            "snapshots": [{"step": snap.step, "loss": round(snap.loss, 6),
                           **{name.replace(" ", "_"): grid(snap.scores[name]) for name in DETECTORS}}
                          for snap in r.snapshots],
            "formed": {name.replace(" ", "_"): [{"layer": l, "head": h, "step": step}
                                                for (l, h), step in sorted(r.formed(name).items())]
                       for name in DETECTORS},
            "k_partners": [{"head": [l, h], "snapshots": [{"step": step, "partner": list(p),
                                                           "k_composition": round(x, 6)}
                                                          for step, p, x in trail]}
                           for (l, h), trail in r.k_partners().items()],
            "heads_identical": r.identical(),
            "spread": grid(r.spread())}


@renderables.register(Training)
def _training(result, width: int, **_) -> list:
    return training_renderables(result)


@data.register(Training)
def _training_data(result, **_) -> dict:
    return training_data(result)


@notebook_figure.register(Training)
def _training_figure(r) -> str:
    """The run's slide as an image under its tables in Jupyter (when matplotlib is installed)."""
    import base64

    from mha_trace.errors import MhaError
    from mha_trace.render.training_slide import training_png

    try:
        png = training_png(r)
    except MhaError:  # no matplotlib: the tables alone
        raise TypeError("no figure without matplotlib") from None
    return (f'<img alt="the loss and each head\'s scores over the steps" style="max-width:100%" '
            f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')


import mha_trace.render.training_slide  # noqa: E402,F401 (registers the slide of what this file shows)
