"""Render `explain --why`: each key's score split by source, and the weights without each source."""

import numpy as np
from rich.text import Text

from mha_trace.io.output import new_table
from mha_trace.render.matrices import MASKED, fmt, shade, weights_table

TOP_PAIRS = 3  # the largest (query part, key part) terms named per key
TOP_SOURCES = 5  # the sources whose "without" rows the terminal shows


def largest_pairs(why, j: int, n: int = TOP_PAIRS) -> list[tuple[str, float]]:
    """Key j's n largest terms (by size), named "query source·key source" (one name when the
    query and key parts come from the same source)."""
    S = len(why.sources)
    flat = why.pairs[:, :, j].ravel()
    order = np.argsort(-np.abs(flat), kind="stable")[:n]
    name = lambda s, t: why.sources[s] if s == t else f"{why.sources[s]}·{why.sources[t]}"
    return [(name(i // S, i % S), float(flat[i])) for i in order if flat[i] != 0]


def moving_sources(why, n: int | None = None) -> list[int]:
    """The sources in the order their removal moves the weights most (ties: as listed)."""
    order = sorted(range(len(why.sources)), key=lambda s: -why.shift(s))
    return order if n is None else order[:n]


def why_renderables(tokens, token: str, why, decimals: int, name: str | None = None) -> list:
    """One head's split (`name`: the head as its view names it, "3.1" in a model)."""
    name = name or str(why.head)
    table = new_table(f"Head {name}, query '{token}': each score q·k/√d_k split by where q "
                      f"and k come from")
    table.add_column("key")
    table.add_column("score", justify="right")
    table.add_column("weight", justify="right")
    table.add_column(f"largest parts (query part·key part), of {len(why.sources)} sources",
                     overflow="fold")
    weights = why.weights()
    for j, t in enumerate(tokens):
        shown = ", ".join(f"{name} {x:+.{min(decimals, 3)}f}" for name, x in largest_pairs(why, j))
        weight = (Text(MASKED + " masked") if not why.allowed[j]
                  else Text(fmt(weights[j], decimals), style=shade(float(weights[j]))))
        table.add_row(t, fmt(why.score[j], decimals), weight, shown,
                      style=None if why.allowed[j] else "dim")
    picked = moving_sources(why, TOP_SOURCES)
    rows = np.stack([weights] + [why.without(s) for s in picked])
    mask = np.broadcast_to(why.allowed, rows.shape)
    names = ["weights"] + [f"without {why.sources[s]}" for s in picked]
    more = (f" (the {len(picked)} of {len(why.sources)} sources that move them most; --format json "
            f"has every one)" if len(picked) < len(why.sources) else "")
    without = weights_table(f"Head {name} without each source: the weights again with that "
                            f"source's terms taken out of every score{more}", tokens, rows, mask,
                            decimals, rows=names, corner="")
    return [table, without]


def why_words(why) -> Text:
    """What the sources are, from the sources there are (a config's or a module's q and k split
    into their dims, or a model's stream)."""
    if why.sources[0].startswith("dim "):
        return Text("A config's q and k are given (or generated) vectors: each score is the sum of "
                    "the head's d_k products q_d·k_d (÷ √d_k), one source per dim.")
    names = set(why.sources)
    said = ["the token embedding"]
    said.append("the position embedding" if "position" in names else
                "no position embedding (RoPE turns q and k by position inside the attention)")
    said.append("each earlier layer's attention output" + (
        " (one source per head: --by-head)" if any("." in n for n in names) else
        " (each head's with --by-head)") + " and MLP output")
    if any("cross-attention" in n or ".X" in n for n in names):
        said.append("each earlier layer's cross-attention output (what the text heard; its heads L.X1, "
                    "L.X2, ... with --by-head)")
    if "biases" in names:
        said.append("the biases (norm shifts, projection and output biases)")
    return Text(f"Sources: {', '.join(said)}. Each LayerNorm or RMSNorm is frozen at the scale it "
                f"computed, so the parts add up to the score exactly. \"A·B\" is A's part of q "
                f"times B's part of k; one name means both came from it (the table lists these terms; the page and "
                f"--png show each source's share: its own term and half of each term it shares).")


def why_data(why, tokens) -> dict:
    r = lambda x: float(x)
    parts = why.parts
    return {"sources": list(why.sources),
            "keys": [{"token": t, "score": r(why.score[j]), "masked": not bool(why.allowed[j]),
                      "parts": {s: r(parts[k, j]) for k, s in enumerate(why.sources)},
                      "largest_pairs": [{"pair": n, "value": x} for n, x in largest_pairs(why, j)]}
                     for j, t in enumerate(tokens)],
            "without": {why.sources[s]: [r(x) for x in why.without(s)]
                        for s in moving_sources(why)}}
