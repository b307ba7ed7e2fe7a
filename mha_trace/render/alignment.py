"""Render `survey --model whisper --audio FILE`: what Whisper heard, its cross-attention heads by how
well they follow the sound, and (--timestamps) each word on a time axis."""

import numpy as np
from rich.text import Text

from mha_trace.analyses.alignment import CHOSEN, FRAMES_PER_SECOND, CrossHeads, Hearing, Listening
from mha_trace.analyses.encoder import EncoderHeads
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables
from mha_trace.core.head import Head, head_names


def _head(layer_head) -> str:
    return Head(*layer_head).name


def heard_line(r) -> Text:
    """What every view of a clip opens with: the model, the file and what it heard."""
    return Text(f"{r.card.name} heard {r.audio} ({r.seconds:.1f} s):\n  \"{r.text}\"", style="bold")


def hearing_renderables(h: Hearing, width: int) -> list:
    L, H = h.disagreement.shape
    out = [heard_line(h),
           Text(f"Each of the {L * H} cross-attention heads ({L} decoder layers × {H}: a text token's "
                f"query, the audio frames' keys) aligned alone, Whisper's way: its weights over the "
                f"speech, standardised over the tokens, median-filtered, then the cheapest path "
                f"through tokens × time (dynamic time warping). A head that follows the sound lands "
                f"where the others do: its disagreement is the median, over the other heads, of the "
                f"mean distance between the times their paths enter each token."),
           _grid(h, "Disagreement (s) of each head; * the model's published alignment heads",
                 lambda layer, head: f"{h.disagreement[layer, head]:.3f}"),
           Text(f"A position reads one token and writes the next, said later. Among the {L * H // 2} "
                f"heads that disagree least, some listen to the token read, others to the token being "
                f"written; a head's lag is the median, over the tokens, of how much later than those "
                f"{L * H // 2} its path enters them. The latest listen to what is written: the ones "
                f"word timings need."),
           _grid(h, f"Lag (s) of the {L * H // 2} that disagree least; * published",
                 lambda layer, head: f"{h.lag[layer, head]:+.2f}" if Head.at(layer, head) in h.following else "·"),
           Text(f"The {CHOSEN} latest of them: {' '.join(_head(x) for x in h.found)}. "
                f"Published (read only to compare): {' '.join(_head(x) for x in h.published)}. "
                f"Precision@{CHOSEN}: {h.precision} of {CHOSEN} (chance {h.chance:.1f}). The published "
                f"heads came with the model (how they were chosen is not published); agreement "
                f"and lag are what the attention alone can say.")]
    if h.matrix is not None:
        out.append(_strip(h, width))
    if h.words is not None:
        out.append(_timeline(h, width))
    return out


def _grid(h: Hearing, title: str, cell):
    """A layers × heads table of cell(layer, head) (from 0), the published heads starred."""
    L, H = h.disagreement.shape
    grid = new_table(title)
    grid.add_column("layer")
    for head in range(1, H + 1):
        grid.add_column(f"head {head}", justify="right")
    published = set(h.published)
    for layer in range(1, L + 1):
        grid.add_row(str(layer), *(f"{cell(layer - 1, head - 1)}{'*' if (layer, head) in published else ' '}"
                                   for head in range(1, H + 1)))
    return grid


SHADES = " ░▒▓█"


def _span(h: Hearing, width: int) -> int:
    """Columns of the time axis: the same in the picture and the timeline, so they line up."""
    longest = max(max((len(t.strip()) for t in h.tokens), default=4), 4)
    return max(10, min(60, width - longest - 22))


def _strip(h: Hearing, width: int):
    """The alignment picture in text: a row for each text token (the row of the position that
    writes it), time across, each row shaded from its quietest to its loudest bin."""
    return _shaded(h.matrix[:len(h.tokens)], h.tokens, _span(h, width),
                   f"Where each token listens: the published heads' weights over the speech "
                   f"(0 to {h.seconds:.2f} s across), each row from its least to its most")


def _shaded(rows, tokens, span: int, title: str, label: str = "token"):
    labels = [t.strip() or repr(t) for t in tokens]
    bins = np.array_split(np.arange(rows.shape[1]), min(span, rows.shape[1]))  # no bin left empty
    cells = np.stack([rows[:, b].mean(1) for b in bins], 1)
    low, high = cells.min(1, keepdims=True), cells.max(1, keepdims=True)
    level = np.round((cells - low) / np.where(high > low, high - low, 1) * (len(SHADES) - 1))
    table = new_table(title)
    table.add_column(label)
    table.add_column("", no_wrap=True)
    for label, row in zip(labels, level.astype(int)):
        table.add_row(label, "".join(SHADES[i] for i in row))
    return table


def _timeline(h: Hearing, width: int):
    """Each word's span as a bar on one time axis, the audio's length across."""
    span = _span(h, width)
    table = new_table(f"When each word is said: the published heads' path (0 to {h.seconds:.2f} s "
                      f"across)")
    table.add_column("word")
    table.add_column("start", justify="right")
    table.add_column("end", justify="right")
    table.add_column("", no_wrap=True)
    for w in h.words:
        a = min(span - 1, int(w.start / h.seconds * span))
        b = max(a + 1, min(span, round(w.end / h.seconds * span)))
        table.add_row(w.word.strip(), f"{w.start:.2f}", f"{w.end:.2f}",
                      " " * a + "█" * (b - a) + "·" * (span - b))
    return table


def hearing_data(h: Hearing) -> dict:
    found = {"model": h.card.name, "audio": h.audio, "seconds": round(h.seconds, 4), "text": h.text,
             "tokens": list(h.tokens),
             "heads": {"disagreement_seconds": h.disagreement.round(4).tolist(),
                       "lag_seconds": h.lag.round(4).tolist(),
                       "following": sorted(head.name for head in h.following),
                       "ranking": [head.name for head in h.ranking],
                       "found": [_head(x) for x in h.found],
                       "published": [_head(x) for x in h.published],
                       f"precision_at_{CHOSEN}": h.precision, "chance": round(h.chance, 3)}}
    if h.matrix is not None:
        found["alignment"] = {"matrix": h.matrix.round(3).tolist(),
                              "path": [h.path[0].tolist(), h.path[1].tolist()]}
    if h.words is not None:
        found["words"] = [{"word": w.word.strip(), "start": round(w.start, 2), "end": round(w.end, 2)}
                          for w in h.words]
    return found


@renderables.register(Hearing)
def _renderables(h, width: int, **_) -> list:
    return hearing_renderables(h, width)


@data.register(Hearing)
def _data(h, **_) -> dict:
    return hearing_data(h)


def listening_renderables(h: Listening, width: int) -> list:
    L, H, frames = h.weights.shape
    span = min(frames, max(10, min(60, width - 30)))
    bins = np.array_split(np.arange(frames), span)
    shade = lambda row: "".join(SHADES[int(i)] for i in np.round(row / (row.max() or 1) * (len(SHADES) - 1)))
    start, end = h.span
    here = (lambda b: b[0] <= h.index <= b[-1]) if h.encoder else \
        (lambda b: start <= (b[0] + 0.5) / FRAMES_PER_SECOND < end)  # a frame's bin, or a word's span
    axis = "".join("█" if here(b) else "·" for b in bins)
    what = "listens" if h.effect is None else "listens, by effect (weight × ‖v·W_O‖)"
    who = f"the frame at {h.token}" if h.encoder else f"the position that writes '{h.token.strip()}'"
    heads = "encoder head" if h.encoder else "cross-attention head"
    table = new_table(f"Where {who} {what}, in every {heads} (0 to {h.seconds:.2f} s across"
                      f"{'' if h.encoder else '; * published alignment heads'})")
    table.add_column("head")
    table.add_column("peak (s)", justify="right")
    table.add_column("weight", justify="right")
    table.add_column("", no_wrap=True)
    loud = np.array([h.loudness[b].max() for b in bins])
    table.add_row("sound", "", "", shade(loud))
    table.add_row("here" if h.encoder else "said", f"{start:.2f}", f"–{end:.2f}", axis, end_section=True)
    for layer, head in np.ndindex(L, H):
        w = (h.weights if h.effect is None else h.effect)[layer, head]  # what the rows show
        cells = np.array([w[b].sum() for b in bins])
        name = f"{Head.at(layer, head)}{'*' if (layer + 1, head + 1) in h.published else ''}"
        table.add_row(name, f"{np.argmax(w) / FRAMES_PER_SECOND:.2f}", f"{w.max():.3f}", shade(cells),
                      end_section=head == H - 1)
    shown = h.weights if h.effect is None else h.effect
    near = 0.1 if h.encoder else 0.0  # a frame's own moment: the 0.1 s around it
    inside = [(layer + 1, head + 1) for layer, head in np.ndindex(L, H)
              if start - near <= np.argmax(shown[layer, head]) / FRAMES_PER_SECOND < end + near]
    where = (f"within {near:.1f} s of it" if h.encoder else f"inside those {end - start:.2f} s")
    said = (f"The frame at {h.token} (frame {h.index}) sends its query, in each of the encoder's heads, "
            f"over the 1,500 frames' keys (every frame looks at every frame); each row is one head's "
            f"weights over the speech, renormalised there, shaded from none to its largest."
            if h.encoder else
            f"The token '{h.token.strip()}' (text token {h.index}) is written by the position before "
            f"it, whose query each cross-attention head sends over the 1,500 audio frames' keys; "
            f"each row is one head's weights over the speech, shaded from none to its largest. "
            f"The published heads' path says it was said from {start:.2f} to {end:.2f} s.")
    return [heard_line(h), Text(said), table,
            Text(f"{len(inside)} of {L * H} heads peak {where}: "
                 f"{' '.join(head_names(inside)) or 'none'}.")]


def listening_data(h: Listening) -> dict:
    return {"model": h.card.name, "audio": h.audio, "seconds": round(h.seconds, 4), "text": h.text,
            "token": h.token.strip(), "index": h.index, "said": [round(h.span[0], 2), round(h.span[1], 2)],
            "heads": [{"head": Head.at(layer, head).name, "peak": round(h.peak(layer + 1, head + 1), 2),
                       "weight": round(float(h.weights[layer, head].max()), 4),
                       "published": (layer + 1, head + 1) in h.published}
                      for layer, head in np.ndindex(*h.weights.shape[:2])],
            "weights": h.weights.round(4).tolist(),
            **({} if h.effect is None else {"effect": h.effect.round(4).tolist(),
                                            "effect_peaks": (h.effect.argmax(-1) / FRAMES_PER_SECOND).round(2).tolist()})}


@renderables.register(Listening)
def _listening(h, width: int, **_) -> list:
    return listening_renderables(h, width)


@data.register(Listening)
def _listening_data(h, **_) -> dict:
    return listening_data(h)


def cross_head_renderables(c: CrossHeads, width: int) -> list:
    name, rows = _head(c.head), c.rows[c.head[0] - 1, c.head[1] - 1]
    steps = np.diff(rows.argmax(-1) / FRAMES_PER_SECOND)
    return [heard_line(c),
            _shaded(rows, c.tokens, max(10, min(60, width - 20)),
                    f"Cross-attention head {name}{' (a published alignment head)' if c.head in c.published else ''}: "
                    f"each token's row over the speech (0 to {c.seconds:.2f} s across), from its least "
                    f"to its most"),
            Text(f"Its peaks move forward with the text at {int((steps >= 0).sum())} of {len(steps)} "
                 f"steps from one token to the next; `survey --model whisper --audio {c.audio}` "
                 f"ranks every head.")]


BINS = 20  # time bins across a head's map: ten braille characters, six maps in 80 columns


def _bins(frames: int) -> list:
    return np.array_split(np.arange(frames), min(BINS, frames))


def _maps(binned: np.ndarray, starred: set, width: int) -> Text:
    """(layers, heads, rows, columns) as braille maps (render.model's), layers down and heads
    across; a * after the maps of the (layer, head) pairs in `starred`."""
    from mha_trace.render.model import braille_map

    L, H = binned.shape[:2]
    cell = (binned.shape[-1] + 1) // 2
    if 4 + H * (cell + 1) > width:
        from mha_trace.errors import MhaError

        raise MhaError(f"the heads' maps need {4 + H * (cell + 1)} columns and the output has {width} "
                       f"(try --width 100)", quantity="width")
    grid = Text(" " * 4 + "".join(f"H{h + 1}".ljust(cell + 1) for h in range(H)), style="bold")
    for layer in range(L):
        maps = [braille_map(binned[layer, h]) for h in range(H)]
        for k in range(len(maps[0])):
            grid.append("\n")
            grid.append(f"L{layer + 1}".ljust(4) if k == 0 else " " * 4, style="bold")
            for h, m in enumerate(maps):
                grid.append_text(m[k])
                star = k == 0 and (layer + 1, h + 1) in starred
                grid.append("*" if star else " " if h < H - 1 else "")
    return grid


def cross_heads_renderables(c: CrossHeads, width: int) -> list:
    """Every head as a braille map: the text down, the speech across in BINS bins of equal time,
    each bin the weight its frames hold."""
    L, H, T, frames = c.rows.shape
    binned = np.stack([c.rows[..., b].sum(-1) for b in _bins(frames)], -1)  # (L, H, T, bins)
    return [heard_line(c),
            Text(f"Every cross-attention head ({L} decoder layers × {H}): the {T} text tokens down (the "
                 f"position that writes each), the speech across (0 to {c.seconds:.2f} s in "
                 f"{binned.shape[-1]} bins), 4 × 2 per character; a dot is a bin with at least half "
                 f"of its token's top weight. A head that follows the sound draws a line from top "
                 f"left to bottom right. A * after a map: a published alignment head."),
            _maps(binned, set(c.published), width),
            Text(f"One head: --head L.H; every head ranked: survey --model whisper --audio {c.audio}.")]


def encoder_binned(e: EncoderHeads) -> np.ndarray:
    """(layers, heads, bins, bins): each bin of query frames' mean weight on each bin of keys."""
    bins = _bins(e.rows.shape[-1])
    keys = np.stack([e.rows[..., b].sum(-1) for b in bins], -1)
    return np.stack([keys[..., b, :].mean(-2) for b in bins], -2)


def encoder_renderables(e: EncoderHeads, width: int) -> list:
    L, H, frames = e.rows.shape[:3]
    stays = f"on average {100 * e.kept.mean():.0f}% of a speech frame's weight stays on the speech"
    if e.head is not None:
        layer, head = e.head
        rows = e.rows[layer - 1, head - 1]
        bins = np.array_split(np.arange(frames), min(24, frames))
        labels = [f"{b[0] / FRAMES_PER_SECOND:.2f} s" for b in bins]
        return [heard_line(e),
                _shaded(np.stack([rows[b].mean(0) for b in bins]), labels, max(10, min(60, width - 20)),
                        f"Encoder head {Head(layer, head)}: the speech's frames down (each row {frames // len(bins)} "
                        f"or so, from the time shown) looking across at the speech (0 to {e.seconds:.2f} s), "
                        f"each row from its least to its most", label="from"),
                Text(f"Here {100 * e.kept[layer - 1, head - 1]:.0f}% of a speech frame's weight stays on the "
                     f"speech; the rest goes to the silence after it (the encoder always reads 30 s).")]
    binned = encoder_binned(e)
    return [heard_line(e),
            Text(f"Every encoder self-attention head ({L} layers × {H}): the speech's {frames} frames of "
                 f"20 ms down (queries) and across (keys), 0 to {e.seconds:.2f} s in {binned.shape[-1]} "
                 f"bins each way, 4 × 2 per character; a dot is a key bin with at least half of its row's "
                 f"top weight. A head that listens around its own moment draws the diagonal; a column is "
                 f"a moment every frame listens to. Weights over the speech alone: {stays}, the rest on "
                 f"the silence after it (the encoder always reads 30 s)."),
            _maps(binned, set(), width),
            Text("One head: --head L.H.")]


@renderables.register(EncoderHeads)
def _encoder_heads(e, width: int, **_) -> list:
    return encoder_renderables(e, width)


@data.register(EncoderHeads)
def _encoder_heads_data(e, **_) -> dict:
    found = {"model": e.card.name, "audio": e.audio, "seconds": round(e.seconds, 4), "text": e.text,
             "frames": int(e.rows.shape[-1]), "kept": e.kept.round(4).tolist()}
    if e.head is not None:
        return {**found, "head": _head(e.head), "weights": e.rows[e.head[0] - 1, e.head[1] - 1].round(4).tolist()}
    return {**found, "bins": encoder_binned(e).round(4).tolist()}


@renderables.register(CrossHeads)
def _cross_heads(c, width: int, **_) -> list:
    return cross_heads_renderables(c, width) if c.head is None else cross_head_renderables(c, width)


@data.register(CrossHeads)
def _cross_heads_data(c, **_) -> dict:
    L, H = c.rows.shape[:2]
    found = {"model": c.card.name, "audio": c.audio, "seconds": round(c.seconds, 4), "text": c.text,
             "tokens": [t.strip() for t in c.tokens]}
    if c.head is not None:
        rows = c.rows[c.head[0] - 1, c.head[1] - 1]
        return {**found, "head": _head(c.head), "published": c.head in c.published,
                "peaks": (rows.argmax(-1) / FRAMES_PER_SECOND).round(2).tolist(), "weights": rows.round(4).tolist()}
    return {**found, "published": [_head(x) for x in c.published],
            "heads": {Head.at(layer, head).name: c.rows[layer, head].round(4).tolist()
                      for layer in range(L) for head in range(H)}}


import mha_trace.render.alignment_slide  # noqa: E402,F401 (registers the slide of what this file shows)
import mha_trace.render.page  # noqa: E402,F401 (registers the page of what this file shows)
