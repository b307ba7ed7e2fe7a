"""Render a pretrained model's heads: an overview of every layer.head, one layer, one head.

The overview draws each head's weights as a braille map: one character covers 4 queries (rows)
by 2 keys (columns), and a dot marks a key that gets at least half of its query's largest weight,
so a previous-token head is a line just below the diagonal, a [CLS] sink a line down the left
edge. It needs no colour; on a colour terminal a character is as bright as its strongest weight.
"""

import math

import numpy as np
from rich.style import Style
from rich.text import Text

from mha_trace.render.matrices import fmt, legend, rounded, shade, weights_table

_LEFT, _RIGHT = (0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80)  # braille dots by row


def braille_map(weights: np.ndarray) -> list[Text]:
    """(T, T) weights -> lines of braille: 4 queries by 2 keys per character."""
    T = len(weights)
    strong = weights >= 0.5 * weights.max(axis=1, keepdims=True)
    lines = []
    for top in range(0, T, 4):
        line = Text()
        for left in range(0, T, 2):
            bits, peak = 0, 0.0
            for r in range(4):
                for c, dots in ((0, _LEFT), (1, _RIGHT)):
                    i, j = top + r, left + c
                    if i < T and j < T:
                        peak = max(peak, float(weights[i, j]))
                        bits |= dots[r] if strong[i, j] else 0
            # never darker than a third of the ramp: a weak map must stay visible on black
            line.append(chr(0x2800 + bits), style=Style(color=shade(0.35 + 0.65 * peak).bgcolor))
        lines.append(line)
    return lines


def overview(sentence, tokens, w: np.ndarray, width: int) -> list:
    """Every layer.head of the model as a small braille map, laid out to fit `width`.

    tokens, w: the sentence's labels and (layers, heads, T, T) weights, or their words.
    """
    model = sentence.model
    T = len(tokens)
    cell, tall = math.ceil(T / 2), math.ceil(T / 4)
    out = [Text(f"{model.name}: every head on \"{sentence.text}\"  ({T} tokens, "
                f"{model.layers} layers × {model.heads} heads)", style="bold")]
    layers_down = 4 + model.heads * (cell + 1) <= width
    rows, cols = (model.layers, model.heads) if layers_down else (model.heads, model.layers)
    name = lambda r, c: (r + 1, c + 1) if layers_down else (c + 1, r + 1)
    label = 4
    grid = Text(" " * label)
    for c in range(cols):
        grid.append(f"{('H' if layers_down else 'L')}{c + 1}".ljust(cell + 1), style="bold")
    for r in range(rows):
        maps = [braille_map(w[name(r, c)[0] - 1, name(r, c)[1] - 1]) for c in range(cols)]
        grid.append("\n" if r == 0 else "\n\n")
        for k in range(tall):
            if k:
                grid.append("\n")
            grid.append(f"{'L' if layers_down else 'H'}{r + 1}".ljust(label) if k == 0
                        else " " * label, style="bold")
            for m in maps:
                grid.append_text(m[k])
                grid.append(" ")
    out.append(grid)
    out.append(Text(f"Each map: rows are queries, columns keys, 4 queries × 2 keys per character, "
                    f"in token order ({' '.join(tokens)}). A dot is a key that gets at "
                    f"least half of its query's largest weight. One head large: --head L.H; a "
                    f"layer's tables: --layer L."))
    return out


def word_weights(sentence, weights: np.ndarray) -> tuple[list, np.ndarray]:
    """Pieces grouped into words: attention to a word is the sum over its pieces (columns),
    from a word the mean over its pieces (rows), so every row still sums to 1."""
    groups, labels = [], []
    for i, (tok, word) in enumerate(zip(sentence.tokens, sentence.words)):
        if word is not None and groups and sentence.words[groups[-1][0]] == word:
            groups[-1].append(i)
            labels[-1] += tok.removeprefix("##")
        else:
            groups.append([i])
            labels.append(tok)
    summed = np.stack([weights[..., g].sum(-1) for g in groups], -1)
    meaned = np.stack([summed[..., g, :].mean(-2) for g in groups], -2)
    return _distinct(labels), meaned


def _distinct(labels: list) -> list:
    return [f"{t}·{i}" if labels.count(t) > 1 else t for i, t in enumerate(labels)]


def head_tables(title: str, tokens, weights, picked: list, layer: int, decimals: int,
                words: bool) -> list:
    """One weights table per (layer, head) picked, heads counted from 1."""
    out = [Text(title, style="bold")]
    for h in picked:
        out.append(weights_table(f"Head {layer}.{h}", tokens, weights[h - 1], None, decimals))
    note = (" Rows and columns are words: to a word is the sum over its pieces, from a word the "
            "mean." if words else "")
    out.append(Text(legend().plain + note))
    return out


def heads_data(sentence, tokens, weights, picked: list[tuple[int, int]], decimals: int,
               words: bool) -> dict:
    return {"command": "heads", "model": sentence.model.name, "sentence": sentence.text,
            "tokens": list(tokens), "words": words, "decimals": decimals,
            "heads": [{"layer": l, "head": h, "weights": rounded(weights[l - 1, h - 1], decimals)}
                      for l, h in picked]}


def ablation_renderables(a, decimals: int) -> list:
    names = ", ".join(f"{l}.{h}" for l, h in a.removed)
    out = [Text(f"{a.sentence.model.name}: \"{a.sentence.text}\" without head"
                f"{'s' if len(a.removed) > 1 else ''} {names} (zeroed before W_O in "
                f"{'their layers' if len(a.removed) > 1 else 'its layer'})", style="bold")]
    from mha_trace.output import new_table

    table = new_table("How far each token's final vector moved")
    table.add_column("token", style="bold")
    table.add_column("L2 distance", justify="right")
    table.add_column("relative", justify="right")
    table.add_column("cosine", justify="right")
    for t, d, r, c in zip(a.sentence.labels, a.distance, a.relative, a.cosine):
        table.add_row(t, fmt(d, decimals), f"{r:.1%}", fmt(c, decimals))
    out.append(table)
    out.append(Text(f"Largest move: {a.sentence.labels[int(np.argmax(a.relative))]} "
                    f"({float(np.max(a.relative)):.1%} of its vector's norm). Relative = L2 "
                    f"distance ÷ the norm of the full model's vector; cosine 1 means the "
                    f"direction is unchanged."))
    return out


def ablation_data(a, decimals: int) -> dict:
    r = lambda xs: [round(float(x), decimals) for x in xs]
    return {"command": "ablate", "model": a.sentence.model.name, "sentence": a.sentence.text,
            "tokens": list(a.sentence.labels),
            "removed": [{"layer": l, "head": h} for l, h in a.removed],
            "l2_distance": r(a.distance), "relative": r(a.relative), "cosine": r(a.cosine),
            "decimals": decimals}
