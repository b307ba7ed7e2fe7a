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

from mha_trace.errors import MhaError
from mha_trace.core.masks import allowed
from mha_trace.render.matrices import EFFECT_NOTE, legend, shade, weights_table, with_effect_tables
from mha_trace.records import data, renderables
from mha_trace.analyses.analysis import ModelHeads
from mha_trace.analyses.model_analysis import HeadRanking, Prediction
from mha_trace.core.head import Head

_LEFT, _RIGHT = (0x01, 0x02, 0x04, 0x40), (0x08, 0x10, 0x20, 0x80)  # braille dots by row


def braille_map(weights: np.ndarray) -> list[Text]:
    """(T, K) weights -> lines of braille: 4 queries by 2 keys per character."""
    T, K = weights.shape
    strong = weights >= 0.5 * weights.max(axis=1, keepdims=True)
    lines = []
    for top in range(0, T, 4):
        line = Text()
        for left in range(0, K, 2):
            bits, peak = 0, 0.0
            for r in range(4):
                for c, dots in ((0, _LEFT), (1, _RIGHT)):
                    i, j = top + r, left + c
                    if i < T and j < K:
                        peak = max(peak, float(weights[i, j]))
                        bits |= dots[r] if strong[i, j] else 0
            # never darker than a third of the ramp: a weak map must stay visible on black
            line.append(chr(0x2800 + bits), style=Style(color=shade(0.35 + 0.65 * peak).bgcolor))
        lines.append(line)
    return lines


OVERVIEW_TOKENS = 128  # a braille map of more tokens is a blur: --png draws them, JSON has them
TABLE_TOKENS = 48  # a weights table of more keys cannot be read on a screen


def too_long(what: str, count: int, limit: int) -> MhaError:
    return MhaError(f"{what} shows up to {limit} tokens and this sentence has {count}: draw it "
                    f"with --png FILE, get every number with --format json, or shorten the "
                    f"sentence", quantity="sentence")


def overview(sentence, tokens, w: np.ndarray, width: int, what: str = "every head") -> list:
    """Every layer.head of the model as a small braille map: layers down and heads across, else
    the other way round; where neither fits the width, or the maps would run past TALL_LINES,
    one cell a head (`compact_overview`).

    tokens, w: the sentence's labels and (layers, heads, T, T) weights, or their words.
    """
    model, T, label = sentence.model, len(tokens), 4
    cell, tall = math.ceil(T / 2), math.ceil(T / 4)
    across = (width - label) // (cell + 1)  # how many maps fit side by side
    if T > OVERVIEW_TOKENS or across < 1:
        fits = min(OVERVIEW_TOKENS, 2 * (width - label - 1))
        if fits < 1:
            raise MhaError(f"the overview needs at least {label + 2} columns and the output has "
                           f"{width} (try --width 100)", quantity="width")
        raise too_long("The overview", T, fits)
    out = [Text(f"{model.name}: {what} on \"{sentence.text}\"  ({T} tokens, "
                f"{model.layers} layers × {model.heads} heads)", style="bold")]
    layers_down = model.heads <= across
    rows, cols = (model.layers, model.heads) if layers_down else (model.heads, model.layers)
    if cols > across or rows * tall >= TALL_LINES:
        return out + compact_overview(tokens, w)
    name = lambda r, c: (r, c) if layers_down else (c, r)
    grid = Text(" " * label)
    for c in range(cols):
        grid.append(f"{('H' if layers_down else 'L')}{c + 1}".ljust(cell + 1), style="bold")
    for r in range(rows):
        maps = [braille_map(w[name(r, c)]) for c in range(cols)]
        for k in range(tall):  # the label starts each row of maps: no blank line needed
            grid.append("\n")
            grid.append(f"{'L' if layers_down else 'H'}{r + 1}".ljust(label) if k == 0
                        else " " * label, style="bold")
            for m in maps:
                grid.append_text(m[k])
                grid.append(" ")
    out.append(grid)
    out.append(Text(f"Tokens: {' '.join(tokens)}\n"
                    f"Each map: queries down, keys across, 4 × 2 per character; a dot is a key with "
                    f"at least half of its query's top weight. One head: --head L.H; a layer: "
                    f"--layer L."))
    return out


TALL_LINES = 64  # braille maps taller than this (SmolLM2's 30 layers: 120 lines) give way to
# one cell a head


def compact_overview(tokens, w: np.ndarray) -> list:
    """A line a layer and a cell a head: where the head's queries put most weight (the first
    token, the last, the previous one, themselves), with that share averaged over every query
    but the first (which can see only itself in a causal model)."""
    layers, heads, T = w.shape[:3]
    q = np.arange(1, T)
    shares = {"F": w[:, :, q, 0], "E": w[:, :, q, T - 1], "P": w[:, :, q, q - 1],
              "S": w[:, :, q, q]}
    mean = np.stack([v.mean(-1) for v in shares.values()])  # (4, layers, heads)
    grid = Text(" " * 4 + "".join(f"H{h + 1}".ljust(6) for h in range(heads)), style="bold")
    for l in range(layers):
        grid.append(f"\nL{l + 1}".ljust(5), style="bold")
        for h in range(heads):
            k = int(mean[:, l, h].argmax())
            value = float(mean[k, l, h])
            letter = list(shares)[k] if round(value, 2) >= 0.4 else "·"
            grid.append(f"{letter}{value:.2f}".replace("0.", ".", 1).replace("1.00", "1.0").ljust(6),
                        style=Style(color=shade(0.35 + 0.65 * value).bgcolor))
    words = (f"Each head: where its queries put most weight, averaged over every query but the "
             f"first: F the first token ({tokens[0]}), E the last ({tokens[-1]}), P the previous "
             f"token, S itself; · when none takes 0.40; the number is that share (F.92 = 0.92). "
             f"Tokens: {' '.join(tokens)}\n"
             f"Each head's map: --layer L (one layer), --png FILE (every head); --format json has "
             f"every weight.")
    return [grid, Text(words)]


def head_tables(view, title: str, picked: list, layer: int, decimals: int) -> list:
    """One weights table per head picked (from 1) of the layer, each followed by its effect
    table with --effect; a causal model's future keys show as masked."""
    tokens = view.tokens
    if len(tokens) > TABLE_TOKENS:
        raise too_long("A weights table", len(tokens), TABLE_TOKENS)
    out = [Text(title, style="bold")]
    mask = allowed(len(tokens), "causal") if view.sentence.model.capabilities.causal else None
    tables = [weights_table(f"Head {Head(layer, h)}", tokens, view.layers[layer - 1][h - 1], mask,
                            decimals) for h in picked]
    out += with_effect_tables(view, tables, [h - 1 for h in picked], decimals, layer - 1)
    note = (" Rows and columns are words: to a word is the sum over its pieces, from a word the "
            "mean." if view.words else "")
    out.append(Text(legend().plain + note + ("\n" + EFFECT_NOTE if view.effect is not None else "")))
    return out


@renderables.register(ModelHeads)
def model_heads_renderables(view, width: int, decimals: int = 4, **_) -> list:
    """A model's `Heads`: the overview, one layer's tables or one head's."""
    s = view.sentence
    if view.whole and view.effect is not None:
        return overview(s, view.tokens, view.effect, width, "every head's effect weights") + [
            Text(EFFECT_NOTE)]
    if view.whole:
        return overview(s, view.tokens, view.layers, width)
    layer = view.picked[0][0]
    where = f"layer {layer}" if len(view.picked) > 1 else f"head {Head(*view.picked[0])}"
    title = f"{s.model.name}, {where}: \"{s.text}\""
    if view.hide_special:
        title += "  ([CLS] and [SEP] hidden: rows no longer sum to 1)"
    return head_tables(view, title, [h for _, h in view.picked], layer, decimals)


@data.register(ModelHeads)
def model_heads_data(view, decimals: int = 4, **_) -> dict:
    from mha_trace.render.matrices import head_entry, heads_json

    sentence, tokens, weights, words = view.sentence, view.tokens, view.layers, view.words
    m = sentence.model
    picked = view.picked or [(l, h) for l in range(1, m.layers + 1) for h in range(1, m.heads + 1)]
    group = m.heads // (m.kv_heads or m.heads)
    source = {"kind": "model", "model": m.name, "sentence": sentence.text, "words": words,
              "hide_special": view.hide_special}
    settings = {"layers": m.layers, "heads": m.heads, "kv_heads": m.kv_heads or m.heads,
                "d_model": m.d_model, "d_k": m.d_model // m.heads,
                "mask": "causal" if m.capabilities.causal else "none", "pad": 0, "window": None,
                "rope": m.capabilities.rope, "rope_base": m.rope_base}
    return heads_json(source, settings, tokens, view.mask,
                      [head_entry(l, h, (h - 1) // group + 1, weights[l - 1, h - 1], decimals,
                                  None if view.effect is None else view.effect[l - 1, h - 1])
                       for l, h in picked], None, None, decimals)


def ranking_renderables(r, top: int) -> list:
    from mha_trace.io.output import new_table

    m = r.sentence.model
    out = [Text(f"{m.name}: every head removed on its own, ranked by its effect on "
                f"\"{r.sentence.text}\" ({len(r.heads)} heads, one batched pass)", style="bold")]
    shown = min(top, len(r.heads))
    table = new_table(f"The {shown} heads whose removal matters most ({r.measure})")
    table.add_column("#", justify="right")
    table.add_column("head", justify="right")
    table.add_column("effect", justify="right")
    if r.top_drop is not None:
        top = r.top_text
        table.add_column(f"p({top}) change", justify="right")
    for i in range(shown):
        l, h = r.heads[i]
        cells = [str(i + 1), Head(l, h).name, f"{r.effect[i]:.4f}"]
        if r.top_drop is not None:
            cells.append(f"{-100 * r.top_drop[i]:+.1f} pts")
        table.add_row(*cells)
    out.append(table)
    quiet = int(np.sum(r.effect < 1e-3))
    out.append(Text(f"{quiet} of {len(r.heads)} heads change it by less than 0.001; --top N lists "
                    f"more, --format json has them all."))
    return out


def ranking_data(r) -> dict:
    return {"command": "ablate", "model": r.sentence.model.name, "sentence": r.sentence.text,
            "measure": r.measure,
            "ranking": [{"layer": l, "head": h, "effect": float(e),
                         **({} if r.top_drop is None else {"top_drop": float(d)})}
                        for (l, h), e, d in zip(r.heads, r.effect,
                                                r.top_drop if r.top_drop is not None else r.effect)]}


def prediction_renderables(p) -> list:
    from mha_trace.io.output import new_table

    m = p.model
    out = [Text(f"{m.name}: the next token after \"{p.text}\"", style="bold")]
    table = new_table(f"Top {len(p.top)} next tokens")
    table.add_column("#", justify="right")
    table.add_column("token")
    table.add_column("id", justify="right")
    table.add_column("probability", justify="right")
    for i, (token, prob) in enumerate(p.top):
        table.add_row(str(i + 1), repr(p.words[token]), str(token), f"{prob:.2%}")
    out.append(table)
    if p.generated:
        from mha_trace.errors import printable

        out.append(Text(f"Greedy, {len(p.generated)} tokens: "
                        + printable(p.text + p.continuation)))
    out.append(Text("Plain text in, no chat template; ␣ marks a leading space."))
    return out


def prediction_data(p) -> dict:
    return {"command": "predict", "model": p.model.name, "sentence": p.text,
            "top": [{"token": p.words[t], "id": t, "probability": float(q)}
                    for t, q in p.top],
            "generated": [{"token": p.words[t], "id": t} for t in p.generated],
            "text": p.text + p.continuation if p.generated else p.text}


@renderables.register(HeadRanking)
def _ranking(r, width: int, top: int = 20, **_) -> list:
    return ranking_renderables(r, top)


@data.register(HeadRanking)
def _ranking_data(r, **_) -> dict:
    return ranking_data(r)


@renderables.register(Prediction)
def _prediction(p, width: int, **_) -> list:
    return prediction_renderables(p)


@data.register(Prediction)
def _prediction_data(p, **_) -> dict:
    return prediction_data(p)


import mha_trace.render.heads_slide  # noqa: E402,F401 (registers the slide of what this file shows)
import mha_trace.render.page  # noqa: E402,F401 (registers the page of what this file shows)
