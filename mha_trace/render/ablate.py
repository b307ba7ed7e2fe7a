"""Render `ablate`: the output with heads removed, and how far each token moved. The lecture's
module on a config shows both outputs; a model, how far each final vector moved and what that
did to the next token."""

import numpy as np
from rich.text import Text

from mha_trace.analyses.ablated import Ablation
from mha_trace.analyses.analysis import LectureHeads
from mha_trace.io.output import new_table
from mha_trace.render.matrices import rounded, config_data, describe, fmt, vector
from mha_trace.records import data, renderables
from mha_trace.core.head import Head, head_names


@renderables.register(Ablation)
def _ablation(a, width: int, decimals: int = 4, **_) -> list:
    if isinstance(a.source, LectureHeads):
        return config_renderables(a, decimals)
    return model_renderables(a, decimals)


@data.register(Ablation)
def _ablation_data(a, decimals: int = 4, **_) -> dict:
    if isinstance(a.source, LectureHeads):
        return config_data_of(a, decimals)
    return model_data(a, decimals)


def config_renderables(a, decimals: int) -> list:
    view, heads = a.source, [h for _, h in a.removed]
    out = [Text(f"{view.config.title}: output without head{'s' if len(heads) > 1 else ''} "
                f"{', '.join(map(str, heads))} (zeroed before W_O)  ({describe(view)})",
                style="bold")]
    table = new_table("Per-token change")
    table.add_column("token", style="bold")
    table.add_column("full output", overflow="fold")
    table.add_column("ablated output", overflow="fold")
    table.add_column("L2 distance", justify="right")
    for t, full, abl, dist in zip(a.tokens, a.full, a.output, a.distance):
        table.add_row(t, vector(full, decimals, 8), vector(abl, decimals, 8), fmt(dist, decimals))
    out.append(table)
    out.append(Text(f"Total L2 distance: {fmt(a.total, decimals)} "
                    f"({a.total_relative:.1%} of the full output's norm "
                    f"{fmt(np.linalg.norm(a.full), decimals)})."))
    return out


def config_data_of(a, decimals: int) -> dict:
    return {"command": "ablate", "config": config_data(a.source), "decimals": decimals,
            "removed": [h for _, h in a.removed], "full_output": rounded(a.full, decimals),
            "output": rounded(a.output, decimals),
            "per_token_l2": [float(x) for x in a.distance],
            "total_l2": a.total, "relative": a.total_relative}


def model_renderables(a, decimals: int) -> list:
    s = a.source
    names = ", ".join(head_names(a.removed))
    out = [Text(f"{s.model.name}: \"{s.text}\" without head"
                f"{'s' if len(a.removed) > 1 else ''} {names} (zeroed before W_O in "
                f"{'their layers' if len(a.removed) > 1 else 'its layer'})", style="bold")]
    table = new_table("How far each token's final vector moved")
    table.add_column("token", style="bold")
    table.add_column("L2 distance", justify="right")
    table.add_column("relative", justify="right")
    table.add_column("cosine", justify="right")
    for t, d, r, c in zip(a.tokens, a.distance, a.relative, a.cosine):
        table.add_row(t, fmt(d, decimals), f"{r:.1%}", fmt(c, decimals))
    out.append(table)
    if a.next_full is not None:
        top, word = a.top, a.words
        order = np.argsort(-a.next_ablated)[:5]
        out.append(Text(f"Next token: {word[top]!r} {a.next_full[top]:.1%} with every head, "
                        f"{a.next_ablated[top]:.1%} without (a change of "
                        f"{100 * (a.next_ablated[top] - a.next_full[top]):+.1f} points); KL(full ‖ ablated) = "
                        f"{a.kl:.4f} nats. Top 5 without: "
                        + ", ".join(f"{word[int(i)]!r} {a.next_ablated[i]:.1%}" for i in order)))
    if a.induction is not None:
        out.append(Text(induction_line(a)))
    out.append(Text(f"Largest move: {a.tokens[int(np.argmax(a.relative))]} "
                    f"({float(np.max(a.relative)):.1%} of its vector's norm). Relative = L2 "
                    f"distance ÷ the norm of the full model's vector; cosine 1 means the "
                    f"direction is unchanged."))
    return out


def induction_line(a) -> str:
    """A trained run: the induction heads' scores on its probe, with every head and without."""
    before, after = a.induction
    heads = [(l, h) for l, h in zip(*np.nonzero(before > 0.5))]
    if not heads:
        return ("No head gives over half its weight to the token after an earlier copy on the "
                "run's probe, with every head.")
    said = ", ".join(f"{Head.at(l, h)} {before[l, h]:.2f} → {after[l, h]:.2f}" for l, h in heads)
    return (f"Induction scores on the run's probe (the weight on the token after an earlier copy), "
            f"with every head → without: {said}.")


def model_data(a, decimals: int) -> dict:
    r = lambda xs: [float(x) for x in xs]  # JSON keeps full precision
    s = a.source
    data = {"command": "ablate", "model": s.model.name, "sentence": s.text,
            "tokens": list(a.tokens),
            "removed": [{"layer": l, "head": h} for l, h in a.removed],
            "l2_distance": r(a.distance), "relative": r(a.relative), "cosine": r(a.cosine),
            "decimals": decimals}
    if a.induction is not None:
        grid = lambda g: [[float(x) for x in row] for row in g]
        data["induction"] = {"every_head": grid(a.induction[0]), "without": grid(a.induction[1])}
    if a.next_full is not None:
        data["next_token"] = {"token": a.words[a.top], "id": a.top,
                              "p_full": float(a.next_full[a.top]),
                              "p_ablated": float(a.next_ablated[a.top]), "kl": a.kl}
    return data
