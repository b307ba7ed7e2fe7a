"""Render `ablate --prune`: the loss as heads go, least important first, beside the literature."""

from rich.text import Text

from mha_trace.core.head import head_names
from mha_trace.io.output import new_table
from mha_trace.analyses.pruning import RISES, Pruning
from mha_trace.records import data, renderables


def _rise(p: Pruning, loss: float) -> str:
    return "—" if loss == p.base else f"{(loss / p.base - 1):+.1%}"


def can_go_lines(p: Pruning) -> list[str]:
    """How many heads can go before the loss rises 5% and 10%, and what the literature finds."""
    n = len(p.order)
    parts = []
    for rise in RISES:
        last, over = p.can_go(rise)
        after = "" if over is None else f", {over} raise it more"
        parts.append(f"{last} of {n} ({last / n:.0%}) can go before it rises {rise:.0%}{after}")
    five = p.can_go(RISES[0])[0] / n
    return [
        f"Heads removed least important first: {'; '.join(parts)}.",
        f"Least important: {', '.join(head_names(p.order[:6]))}; the last to go: "
        f"{', '.join(head_names(p.order[-6:][::-1]))}.",
        f"Michel et al. 2019 remove 20% of a WMT Transformer's heads and 40% of BERT's (fine-tuned "
        f"on MNLI) with no noticeable loss of BLEU or accuracy; Voita et al. 2019 prune 38 of 48 "
        f"encoder heads for a drop of 0.15 BLEU. Here {five:.0%} go before the next-token loss rises 5%. "
        f"Not the same measure: they score a task after fine-tuning (Voita et al. prune while "
        f"training); this is a small model's next-token loss on short sentences, with nothing "
        f"retrained.",
    ]


def pruning_renderables(p: Pruning) -> list:
    m = p.model
    out = [Text(f"ablate --prune: {m.name}, {len(p.order)} heads, on {p.corpus} "
                f"({p.tokens:,} next tokens)", style="bold")]
    table = new_table("The next-token loss as heads are removed, least important first (Michel et "
                      "al. 2019's importance: |∂loss/∂gate| per head, normalised within its layer)")
    for name in ("removed", "share", "loss (nats)", "rise"):
        table.add_column(name, justify="right")
    for removed, loss in p.points:
        table.add_row(str(removed), f"{removed / len(p.order):.0%}", f"{loss:.3f}", _rise(p, loss))
    out.append(table)
    out.append(Text("\n".join(can_go_lines(p))))
    return out


def pruning_data(p: Pruning) -> dict:
    return {"command": "ablate", "prune": True, "model": p.model.name, "corpus": p.corpus,
            "tokens": p.tokens, "heads": len(p.order),
            "points": [{"removed": k, "loss": round(loss, 6)} for k, loss in p.points],
            "can_go": {f"{rise:.0%}": dict(zip(("removed", "next"), p.can_go(rise)))
                       for rise in RISES},
            "order": [{"layer": l, "head": h, "importance": round(float(p.importance[l - 1, h - 1]), 6)}
                      for l, h in p.order]}


@renderables.register(Pruning)
def _pruning(result, width: int, **_) -> list:
    return pruning_renderables(result)


@data.register(Pruning)
def _pruning_data(result, **_) -> dict:
    return pruning_data(result)


import mha_trace.render.pruning_slide  # noqa: E402,F401 (registers the slide of what this file shows)
