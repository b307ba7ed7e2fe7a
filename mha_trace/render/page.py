"""The interactive page's data for each record that has one (Heads, Walk, TiledWalk, ShapesReport,
Patching, PathPatching, Hearing), registered with `mha_trace.io.page.page_data`. Weights are kept to what the view shows (16 bits
each, base64: to four decimals, as the terminal and the JSON round them; `--format json` keeps the full precision)."""

import base64
from pathlib import Path

import numpy as np

from mha_trace.analyses.alignment import Hearing
from mha_trace.analyses.analysis import Heads
from mha_trace.analyses.path_patching import PathPatching
from mha_trace.analyses.patching import Patching
from mha_trace.analyses.tiled_walk import TiledWalk
from mha_trace.analyses.walk import Walk
from mha_trace.errors import MhaError
from mha_trace.io.output import finite
from mha_trace.io.page import page_data
from mha_trace.io.units import human_bytes
from mha_trace.analyses.shapes import ShapesReport
from mha_trace.core.head import Head, head_names


def _weights(w: np.ndarray) -> str:
    """Weights in [0, 1] as little-endian uint16 ten-thousandths, base64: the page reads back
    the four decimals every other view prints, rounded the same way (never one off)."""
    q = np.rint(np.clip(np.asarray(w, dtype=np.float64), 0, 1) * 10000).astype("<u2")
    return base64.b64encode(q.tobytes()).decode("ascii")


def _round(a, places: int = 4) -> list:
    return np.round(np.asarray(a, dtype=np.float64), places).tolist()


MAX_WEIGHT_BYTES = 1_500_000  # a page stays under 2 MB: base64 adds a third


@page_data.register(Heads)
def heads_page(view) -> dict:
    """Every layer the view shows (a model's named layer alone), each head's weights."""
    numbers = sorted({l for l, _ in view.picked}) if view.picked else list(range(1, len(view.layers) + 1))
    weights = view.layers[[n - 1 for n in numbers]]
    if weights.size * 2 > MAX_WEIGHT_BYTES:
        raise MhaError(f"the page would hold {weights.size * 2 / 1e6:.1f} MB of weights "
                       f"({len(numbers)} layers × {weights.shape[1]} heads × {weights.shape[2]}² "
                       f"tokens); show one layer with --layer N, or a shorter sentence",
                       quantity="html")
    return {"kind": "heads", "title": view.title, "tokens": list(view.tokens),
            "layer_numbers": numbers, "heads": int(weights.shape[1]),
            "kv_heads": view.kv_heads,
            "picked": [list(p) for p in view.picked] if view.picked else None,
            "weights": _weights(weights),
            "effect": None if view.effect is None else _weights(
                view.effect[[n - 1 for n in numbers]]),
            "mask": None if view.mask is None else np.asarray(view.mask, dtype=int).tolist()}


def _why_page(why) -> dict:
    """--why on the page: each key's largest source parts (they sum to its score with the rest)
    and the weights without each of the sources that move them most."""
    from mha_trace.render.why import TOP_SOURCES, moving_sources

    parts = why.parts
    top = lambda j: sorted(range(len(why.sources)), key=lambda s: -abs(parts[s, j]))[:6]
    return {"keys": [{"score": round(float(why.score[j]), 4),
                      "parts": [[why.sources[s], round(float(parts[s, j]), 4)] for s in top(j)]}
                     for j in range(len(why.score))],
            "sources": len(why.sources),
            "without": [[why.sources[s], _round(why.without(s))]
                        for s in moving_sources(why, TOP_SOURCES)]}


@page_data.register(Walk)
def walk_page(w) -> dict:
    view = w.view
    why = {y.head: y for y in w.why or []}
    return {"kind": "explain", "title": view.through(w.token, w.only),
            "token": w.token,
            "position": w.position, "tokens": list(view.tokens), "sqrt_dk": round(w.sqrt_dk, 4),
            "heads": [{"head": hw.head, "name": view.head_name(hw.head), "kv_head": hw.kv_head, "dims": list(hw.dims),
                       "query": _round(hw.query), "output": _round(hw.output),
                       "terms": [{"token": t.token, "products": _round(t.products), "dot": round(t.dot, 4),
                                  "scaled": round(t.scaled, 4), "masked": t.masked,
                                  "weight": round(t.weight, 4),
                                  "effect": None if t.effect is None else round(t.effect, 4)}
                                 for t in hw.terms],
                       "why": _why_page(why[hw.head]) if hw.head in why else None}
                      for hw in w.heads if (w.only is None or hw.head == w.only)
                      and (not why or hw.head in why)],
            "concat": _round(w.concat), "output": _round(w.output)}


@page_data.register(TiledWalk)
def tiled_page(t) -> dict:
    """The tiled walk, to step through tile by tile: every tile's numbers, as the terminal's."""
    w = t.walk
    number = lambda x: None if x == float("-inf") else round(float(x), 4)  # JSON has no -inf
    return {"kind": "tiled", "title": f"{w.view.through(w.token, w.only, w.position)}, the tiled way",
            "token": w.token, "position": w.position, "block_k": t.block_k,
            "heads": [{"head": h.head, "name": w.view.head_name(h.head),
                       "tiles": [{"keys": tile.keys, "scores": [number(x) for x in tile.scores],
                                  "p": _round(tile.p), "m_old": number(tile.m_old),
                                  "m": number(tile.m_new), "rescale": number(tile.rescale),
                                  "l_old": number(tile.l_old), "l": number(tile.l_new),
                                  "o": _round(tile.o)} for tile in h.tiles],
                       "output": _round(h.output), "explicit": _round(h.explicit),
                       "lse": number(h.lse)}
                      for h in t.heads if w.only is None or h.head == w.only]}


@page_data.register(ShapesReport)
def shapes_page(report) -> dict:
    source = report.run.source
    try:
        lines = Path(source).read_text("utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        lines = []
    steps = [{"line": s.line if s.file == source else None,
              "called_from": s.called_from[0] if s.called_from else None, "code": s.text or s.source,
              "op": s.op, "shape": list(s.shape), "stride": list(s.stride),
              "contiguous": s.contiguous, "view": s.is_view, "dtype": s.dtype, "bytes": s.bytes,
              "alloc": "view" if s.is_view else human_bytes(s.bytes),  # as the terminal writes it
              "phase": s.phase} for s in report.steps]
    z = report.sizes
    title = (f"{type(report.run.module).__name__}.forward: batch {z.batch}, {z.seq} tokens, "
             f"d_model {z.d_model}, {z.heads} heads")
    return {"kind": "shapes", "title": title,
            "file": Path(source).name, "source": lines, "steps": steps}


@page_data.register(Patching)
def patching_page(p) -> dict:
    """The patching grids as shares of the gap (four decimals, as the terminal's two and JSON's six
    round them), with the metric each copy gave and attribution's estimate beside each head."""
    grid = lambda a: None if a is None else {"fraction": finite(p.fraction(a), 4), "metric": _round(a)}
    return {"kind": "patching", "title": f"patch: {p.card.name}, {p.metric}",
            "noising": p.noising, "clean": list(p.clean), "corrupt": list(p.corrupt),
            "values": [round(p.clean_value, 4), round(p.corrupt_value, 4)],
            "residual": grid(p.residual), "heads": grid(p.heads), "attribution": grid(p.attribution),
            "spearman": None if p.rank_correlation is None else round(p.rank_correlation, 4),
            "undefined": p.undefined, "queries": grid(p.queries),
            "kv_groups": grid(p.kv_groups),
            "by_position": None if p.by_position is None else {
                "head": list(p.by_position[0]), **grid(p.by_position[1])}}


@page_data.register(PathPatching)
def path_page(p) -> dict:
    """Path patching's four inputs, each with its metric and share of the gap."""
    return {"kind": "path", "title": f"patch: {p.card.name}, path {p.sender_names} → "
                                     f"{Head(*p.receiver)}, {p.metric}",
            "noising": p.noising, "senders": p.sender_names,
            "receiver": Head(*p.receiver).name, "values": [round(p.clean_value, 4), round(p.corrupt_value, 4)],
            "undefined": p.undefined,
            "via": [{"input": key, "metric": round(v, 4), "fraction": finite(p.fraction(v), 4)}
                    for key, v in p.via.items()]}


@page_data.register(Hearing)
def hearing_page(h) -> dict:
    """Whisper's alignment: each text token's row of the published heads' weights over the speech
    frames (three decimals), the path through them, the sound's loudness, each word's timing and
    each cross-attention head's disagreement and, for the half that disagree least, its lag."""
    T = len(h.tokens)
    return {"kind": "hearing", "title": f"{h.card.name} hears {h.audio}", "text": h.text,
            "tokens": [t.strip() or repr(t) for t in h.tokens], "seconds": round(h.seconds, 4),
            "matrix": _round(h.matrix[:T], 3), "path": [[int(r), int(c)] for r, c in zip(*h.path) if r < T],
            "loudness": _round(h.loudness, 3), "disagreement": _round(h.disagreement, 3),
            "lag": _round(h.lag, 3), "following": sorted(head.name for head in h.following),
            "published": head_names(h.published),
            "found": head_names(h.found), "precision": h.precision,
            "chance": round(h.chance, 2),
            "words": None if h.words is None else [{"word": w.word.strip(), "start": round(w.start, 2),
                                                     "end": round(w.end, 2)} for w in h.words]}
