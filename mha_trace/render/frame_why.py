"""Render `explain --model whisper --audio FILE --token WORD --head L.H --why`: the frames the
head's query weighs most, each score split into (text source, sound source) terms, and where the
weight goes without each source."""

import numpy as np
from rich.text import Text

from mha_trace.analyses.frame_why import SOUND, FrameWhy
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables
from mha_trace.render.alignment import heard_line
from mha_trace.core.head import Head

TOP_FRAMES, TOP_SOURCES, TOP_TERMS = 6, 8, 3


def frame_why_renderables(c: FrameWhy, width: int) -> list:
    w, name = c.why, Head(*c.head).name
    weights = w.weights()
    if c.encoder:
        said = (f"Encoder head {name}, the frame at {c.token}: each frame's score q·k/√d_k is a sum of one "
                f"term per pair of sources, q's and k's both from the sound's stream up to this layer: the "
                f"convolutions' output (sound), the encoder's positions, each earlier encoder layer's "
                f"attention and MLP, the biases.")
        pair = "q source · k source"
    else:
        said = (f"Head {name}{' (a published alignment head)' if c.published else ''}, the position that "
                f"writes '{c.token.strip()}': each frame's score q·k/√d_k is a sum of one term per pair of "
                f"a text source (q: the token and position embeddings, each earlier decoder layer's "
                f"attention, cross-attention and MLP, this layer's self-attention, the biases) and a "
                f"sound source (k, named \"{SOUND}...\": the convolutions' output, the encoder's "
                f"positions, each encoder layer's attention and MLP, the biases).")
        pair = f"text source · {SOUND.rstrip(': ')} source"
    out = [heard_line(c), Text(said + " The norms are frozen at what they computed, so the terms add up "
                               "to the score exactly.")]
    top = new_table(f"The {TOP_FRAMES} frames it weighs most (of 1,500; the speech is the first {c.frames})")
    for column, justify in (("time (s)", "right"), ("score", "right"), ("weight", "right"),
                            (f"largest terms ({pair})", "left")):
        top.add_column(column, justify=justify)
    for j in np.argsort(-weights, kind="stable")[:TOP_FRAMES]:
        top.add_row(f"{j / 50:.2f}", f"{w.score[j]:.3f}", f"{weights[j]:.3f}", ", ".join(
            f"{a}·{b.removeprefix(SOUND)} {v:+.2f}" for a, b, v in _terms(w, j)[:TOP_TERMS]))
    out.append(top)
    table = new_table(f"Without each source: the weights again with its terms taken out of every "
                      f"frame's score (the {min(TOP_SOURCES, len(w.sources))} of {len(w.sources)} that move "
                      f"them most)")
    for column in ("source", "peak (s)", "weight moved"):
        table.add_column(column, justify="left" if column == "source" else "right")
    table.add_row("(the real weights)", f"{c.peak(weights):.2f}", "")
    for s in _moved(w)[:TOP_SOURCES]:
        table.add_row(w.sources[s], f"{c.peak(w.without(s)):.2f}", f"{w.shift(s):.2f}")
    out += [table, Text("Weight moved: half the summed change of the 1,500 weights, from 0 (none) to 1 "
                        "(all of it elsewhere). --format json has every source and term.")]
    return out


def _terms(w, j: int) -> list:
    """(text source, sound source, term) at frame j, the largest first."""
    i, k = np.nonzero(w.pairs[:, :, j])
    found = [(w.sources[a], w.sources[b], float(w.pairs[a, b, j])) for a, b in zip(i, k)]
    return sorted(found, key=lambda t: -abs(t[2]))


def _moved(w) -> list:
    return sorted(range(len(w.sources)), key=lambda s: -w.shift(s))


@renderables.register(FrameWhy)
def _frame_why(c, width: int, **_) -> list:
    return frame_why_renderables(c, width)


@data.register(FrameWhy)
def _frame_why_data(c, **_) -> dict:
    w = c.why
    weights = w.weights()
    return {"model": c.card.name, "audio": c.audio, "text": c.text, "token": c.token.strip(),
            "position": c.index, "head": Head(*c.head).name, "published": c.published,
            "sources": list(w.sources), "peak": c.peak(weights),
            "frames": [{"time": round(j / 50, 2), "score": float(w.score[j]), "weight": float(weights[j]),
                        "terms": {f"{a} · {b}": v for a, b, v in _terms(w, j)}}
                       for j in np.argsort(-weights, kind="stable")[:TOP_FRAMES]],
            "without": [{"source": w.sources[s], "peak": c.peak(w.without(s)), "moved": w.shift(s)}
                        for s in _moved(w)]}
