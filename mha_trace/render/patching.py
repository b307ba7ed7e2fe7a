"""Render `patch`: the residual stream grid (layer × position), the head grid (layer × head),
the heads that carry the most, and JSON."""

import numpy as np
from rich.text import Text

from mha_trace.core.head import Head
from mha_trace.analyses.path_patching import PathPatching
from mha_trace.analyses.patching import Patching
from mha_trace.io.output import finite, new_table, undefined_or
from mha_trace.io.units import shared
from mha_trace.records import data, renderables

STRONG = 0.2  # a share shown in bold


def _cell(x: float) -> Text:
    return Text(shared(x), style="bold" if abs(x) >= STRONG else "")


def patching_renderables(p: Patching, top: int, width: int) -> list:
    way = ("noising: each activation from the corrupted run into the clean one; the share of the "
           "gap it destroys" if p.noising else
           "denoising: each activation from the clean run into the corrupted one; the share of the "
           "gap it restores")
    differ = [t for t, (a, b) in enumerate(zip(p.clean, p.corrupt)) if a != b]
    out = [Text(f"patch: {p.card.name}, metric {p.metric}", style="bold"),
           Text(f"Clean: {' '.join(p.clean)}  ({p.clean_value:.4f})\n"
                f"Corrupted: {' '.join(p.corrupt)}  ({p.corrupt_value:.4f})\n"
                + (f"The texts differ at position{'s' if len(differ) != 1 else ''} "
                   f"{', '.join(map(str, differ))}." if differ else "The two texts are the same, token for token.")
                + f" Each cell: {way} "
                f"(1 = all of it; 0 = none; bold: {STRONG} or more either way)."
                + (f" But {p.undefined}: no share is defined (—), and --format json keeps each "
                   f"patch's metric." if p.undefined else "")),
           _residual(p, differ, width),
           _grid(p.fraction(p.heads), "Each head's output, at every position",
                 [str(h + 1) for h in range(p.heads.shape[1])], "layer \\ head")]
    out += _by_input(p) + _by_position(p, differ)
    f, a = p.fraction(p.heads), p.fraction(p.attribution)
    order = np.argsort(-np.abs(f).ravel(), kind="stable")[:top]
    heads = ", ".join(f"{Head.at(*divmod(int(i), f.shape[1]))} {shared(f.ravel()[i], True)} "
                      f"({shared(a.ravel()[i], True)})" for i in order)
    rho = p.rank_correlation
    follows = (f"whose ranking of all {f.size} heads follows the exact one with Spearman ρ = {rho:.2f}"
               if rho is not None else "whose ranking cannot be compared with the exact one here "
               f"(Spearman's ρ is undefined: {_why_no_rho(p)})")
    out.append(Text(f"The heads that carry the most: {heads}; in brackets, attribution patching's "
                    f"estimate (Nanda 2023: one backward pass, the metric's gradient times each "
                    f"head's change of output), {follows}. Positions marked * are where the two "
                    f"texts differ; a residual entry patched there carries the difference itself. "
                    f"A head's output is its slice of the W_O input, every position at once (with "
                    f"shared K/V heads, each query head's own output)."))
    return out


def _why_no_rho(p: Patching) -> str:
    return "one head, nothing to rank" if p.heads.size < 2 else "no gap, no shares to rank"


def _by_input(p: Patching) -> list:
    """Each head's queries alone, and each K/V group's keys and values (shared by its query heads)."""
    if p.queries is None:
        return []
    H, G = p.queries.shape[1], p.kv_groups.shape[1]
    share = H // G
    groups = [str(g + 1) if share == 1 else f"{g + 1} (heads {g * share + 1}-{(g + 1) * share})"
              for g in range(G)]
    said = (f"One K/V group serves {share} query heads ({G} groups, {H} heads a "
            f"layer): patching its keys and values moves what all {share} read, while a head's "
            f"queries are its own." if share > 1 else
            "Each head has its own keys and values here (no grouped-query sharing).")
    return [_grid(p.fraction(p.queries), "Each head's queries alone", [str(h + 1) for h in range(H)],
                  "layer \\ head"),
            _grid(p.fraction(p.kv_groups), "Each K/V group's keys and values", groups,
                  "layer \\ K/V"),
            Text(said)]


def _by_position(p: Patching, differ: list) -> list:
    if p.by_position is None:
        return []
    (layer, head), values = p.by_position
    rows = [f"{t} {token}{'*' if t in differ else ''}" for t, token in enumerate(p.clean)]
    return [_grid(p.fraction(values)[:, None], f"Head {Head(layer, head)}'s output, one position at a time",
                  ["share"], "position", rows)]


def _residual(p: Patching, differ: list, width: int):
    """Positions down, layers across: every layer that fits the width (every k-th when not)."""
    layers = p.residual.shape[0]
    label = max(len(f"{t} {token}*") for t, token in enumerate(p.clean))
    fits = max(1, (width - label - 2) // 7)
    step = -(-layers // fits)
    shown = list(range(0, layers, step))
    f = p.fraction(p.residual)[shown].T  # (positions, shown layers)
    title = ("The residual stream entering each layer, by position" if step == 1 else
             f"The residual stream entering one layer in {step}, by position (--format json: all)")
    rows = [f"{t} {token}{'*' if t in differ else ''}" for t, token in enumerate(p.clean)]
    return _grid(f, title, [f"L{layer + 1}" for layer in shown], "position", rows)


def _grid(f: np.ndarray, title: str, columns: list, corner: str, rows: list | None = None):
    table = new_table(title)
    table.add_column(corner, justify="left" if rows else "right")
    for name in columns:
        table.add_column(name, justify="right")
    for i, row in enumerate(f):
        table.add_row(rows[i] if rows else str(i + 1), *(_cell(x) for x in row))
    return table


def patching_data(p: Patching) -> dict:
    r = lambda a: np.round(np.asarray(a, float), 6).tolist()
    grid = lambda a: {"metric": r(a), "fraction": finite(p.fraction(a))}
    return {"command": "patch", "model": p.card.name, "metric": p.metric,
            "direction": "noising" if p.noising else "denoising",
            "clean": {"tokens": list(p.clean), "metric": round(p.clean_value, 6)},
            "corrupt": {"tokens": list(p.corrupt), "metric": round(p.corrupt_value, 6)},
            **({"fraction_undefined": p.undefined} if p.undefined else {}),
            "residual": grid(p.residual),
            "heads": {**grid(p.heads), "attribution": grid(p.attribution),
                      **undefined_or("spearman_exact_vs_attribution", p.rank_correlation, 6,
                                     _why_no_rho(p) if p.rank_correlation is None else "")},
            **({} if p.queries is None else {
                "queries": grid(p.queries),
                "kv_groups": {**grid(p.kv_groups),
                              "query_heads_each": p.queries.shape[1] // p.kv_groups.shape[1]}}),
            **({} if p.by_position is None else {"by_position": {
                "head": Head(*p.by_position[0]).name, **grid(p.by_position[1])}})}


@renderables.register(Patching)
def _patching(p, width: int, top: int = 8, **_) -> list:
    return patching_renderables(p, top, width)


@data.register(Patching)
def _patching_data(p, **_) -> dict:
    return patching_data(p)


def path_renderables(p: PathPatching) -> list:
    senders, (rl, rh) = p.sender_names, p.receiver
    way = "from the corrupted run into the clean one" if p.noising else "from the clean run into the corrupted one"
    whose = f"Head {senders}'s output" if len(p.senders) == 1 else f"Heads {senders}' outputs, together,"
    table = new_table(f"{whose} {way}, into head {Head(rl, rh)} through one input")
    for name in ("through", "metric", "share of the gap"):
        table.add_column(name, justify="left" if name == "through" else "right")
    names = {"q": "its queries", "k": "its keys", "v": "its values", "qkv": "all three"}
    for key, value in p.via.items():
        table.add_row(names[key], f"{value:.4f}", _cell(p.fraction(value)))
    return [Text(f"patch: {p.card.name}, path {senders} → {Head(rl, rh)}, metric {p.metric}", style="bold"),
            Text(f"Clean {p.clean_value:.4f}, corrupted {p.corrupt_value:.4f}. The sender's output "
                 f"difference (several senders': their sum) reaches the receiver only through the input named; every other path, "
                 f"and every other head of the receiver's layer, is the target run's (Wang et al. "
                 f"2022's path patching). A head's weights do not depend on its values: a score "
                 f"read off them moves through q and k alone."
                 + (f" But {p.undefined}: no share is defined (—)." if p.undefined else "")),
            table]


def path_data(p: PathPatching) -> dict:
    return {"command": "patch", "model": p.card.name, "metric": p.metric,
            "direction": "noising" if p.noising else "denoising",
            "sender": p.sender_names.replace(" + ", ","), "receiver": Head(*p.receiver).name,
            "clean": round(p.clean_value, 6), "corrupt": round(p.corrupt_value, 6),
            **({"fraction_undefined": p.undefined} if p.undefined else {}),
            "via": {k: {"metric": round(v, 6), "fraction": finite(p.fraction(v))} for k, v in p.via.items()}}


@renderables.register(PathPatching)
def _path(p, width: int, **_) -> list:
    return path_renderables(p)


@data.register(PathPatching)
def _path_data(p, **_) -> dict:
    return path_data(p)


import mha_trace.render.page  # noqa: E402,F401 (registers the page of what this file shows)
import mha_trace.render.patching_slide  # noqa: E402,F401 (registers the slide of what this file shows)
