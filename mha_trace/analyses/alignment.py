"""Where Whisper's decoder listens: each cross-attention head scored by how well its weights follow
the text through time, and word timings from the alignment heads (`survey --model whisper`).

The score needs nothing but the attention. Each head aligns the text to the sound alone, Whisper's
way (below), and its path enters each token at a time. A head that follows the sound lands where
the others do: its disagreement is the median, over the other heads, of the mean distance between
their entry times. Two kinds of head follow it, a token apart: a decoder position reads one token
and writes the next, and some heads listen to the sound of the token read, others to the sound of
the token being written, which is said later. Timings need the second kind, so among the half of
the heads that disagree least, the ones that listen latest rank first: a head's lag is the median,
over the tokens, of its entry time less the median entry time of that half. Whisper's published
alignment heads (config.json) are read only to compare with.

Word timings follow Whisper (openai-whisper's timing.py, as faster-whisper does it): the chosen heads'
weights over the speech frames, each head's standardised over the tokens, a median filter of
width 7 along time, their average, then dynamic time warping from the first token and frame to
the last; a word starts where the path enters its first token's row.
"""

import string
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mha_trace.models.whisper import Heard

from mha_trace.core.head import Head
from mha_trace.models.base import ModelCard, AudioModel
from mha_trace.records import Shows

FRAMES_PER_SECOND = 50  # the encoder's frames: 20 ms each
CHOSEN = 8  # as many heads as Whisper publishes for tiny.en
MEDIAN_WIDTH = 7
PREPENDED, APPENDED = "\"'“¿([{-", "\"'.。,，!！?？:：”)]}、"


@dataclass
class Hearing(Shows):
    """`survey --model whisper --audio FILE`: what Whisper heard, each cross-attention head's
    disagreement with the others, the published alignment heads beside, and (--timestamps) each
    word's timing from the published heads."""

    card: ModelCard
    audio: str  # the file's name
    seconds: float
    text: str
    tokens: tuple  # the text tokens as they read
    disagreement: np.ndarray  # (layers, heads) seconds: lower follows the sound more closely
    lag: np.ndarray  # (layers, heads) seconds after the following heads' entries: later writes
    published: tuple  # the model's own alignment heads, (layer, head) from 1
    words: list | None  # [Word] with --timestamps
    matrix: np.ndarray | None = None  # (text + 1, frames) the published heads' alignment matrix
    path: tuple | None = None  # (rows, columns): the path through it
    loudness: np.ndarray | None = None  # (frames,) the waveform's peak in each 20 ms frame

    @property
    def following(self) -> set:
        """The half of the heads that disagree least (Head values: layer and head from 1)."""
        return {Head.at(*index) for index in _ranked(self.disagreement)[:self.disagreement.size // 2]}

    @property
    def ranking(self) -> list:
        """Every head (a Head): the following heads, the latest first, then the others by their
        disagreement."""
        ranked = [Head.at(*index) for index in _ranked(self.disagreement)]
        half = self.disagreement.size // 2
        return sorted(ranked[:half], key=lambda h: -self.lag[h.index]) + ranked[half:]

    @property
    def found(self) -> list:
        return [(h.layer, h.head) for h in self.ranking[:CHOSEN]]

    @property
    def precision(self) -> int:
        """How many of the CHOSEN best-ranked heads are published alignment heads."""
        return len(set(self.found) & set(self.published))

    @property
    def chance(self) -> float:
        """The published heads expected among CHOSEN heads picked at random."""
        return CHOSEN * len(self.published) / self.disagreement.size


def _ranked(scores: np.ndarray) -> list:
    """Every (layer, head) from 0, the lowest score first."""
    return [divmod(int(i), scores.shape[1]) for i in np.argsort(scores.ravel(), kind="stable")]


def hear(model: AudioModel, heard: "Heard", timestamps: bool = False) -> Hearing:
    """Transcribe the WAV file (greedy), then score every cross-attention head on it."""
    samples = heard.samples
    if len(heard.ids) == heard.prompt:
        from mha_trace.errors import MhaError

        raise MhaError(f"{model.name} heard no words in {heard.source}: nothing to align", exit_code=1)
    words = word_timings(heard, model.tokenizer, model.alignment_heads) if timestamps else None
    matrix = alignment_matrix(heard, model.alignment_heads)
    frames = matrix.shape[1]
    step = len(samples) / max(frames, 1)
    loudness = np.array([np.abs(samples[int(i * step):int((i + 1) * step) + 1]).max(initial=0.0)
                         for i in range(frames)])
    disagreement, lag = head_scores(heard)
    return Hearing(ModelCard.of(model), heard.source, heard.audio_seconds, heard.text.strip(),
                   heard.tokens[heard.prompt:], disagreement, lag, model.alignment_heads,
                   words, matrix, dtw(-matrix), loudness)


@dataclass
class Listening(Shows):
    """`explain --model whisper --audio FILE --token WORD`: where the position that writes one
    token looks at the sound, in every decoder layer's every cross-attention head."""

    card: ModelCard
    audio: str
    seconds: float
    text: str
    token: str  # the token followed, as it reads
    index: int  # its place among the text tokens, from 0
    weights: np.ndarray  # (layers, heads, frames) that position's weights over the speech frames
    published: tuple
    span: tuple  # (start, end) s: the word's timing from the published heads' path
    loudness: np.ndarray  # (frames,)
    effect: np.ndarray | None = None  # (layers, heads, frames) with --effect: weight × ‖v·W_O‖, renormalised
    encoder: bool = False  # the query is a frame of the sound (the encoder's heads), not a text token

    def peak(self, layer: int, head: int) -> float:
        """Where (s) the head's weight is largest."""
        return float(np.argmax(self.weights[layer - 1, head - 1]) / FRAMES_PER_SECOND)


def listen(model: AudioModel, heard: "Heard", token: str | None, position: int | None, effect: bool = False) -> Listening:
    """One text token (by its text, or `position` among the text tokens) through every head;
    effect=True adds each frame's effect weight (Kobayashi et al. 2020: the weight times the length
    of what the frame's value moves through the head's block of W_O, renormalised)."""
    from mha_trace.errors import MhaError

    hearing = hear(model, heard, timestamps=False)
    words = [t.strip() for t in hearing.tokens]
    if position is None:
        wanted = (token or words[0]).strip()
        found = [i for i, w in enumerate(words) if w.lower() == wanted.lower()]
        if not found:
            raise MhaError(f"'{wanted}' is not a token of what {model.name} heard: {' '.join(words)}",
                           quantity="token")
        position = found[0]
    if not 0 <= position < len(words):
        raise MhaError(f"position {position} is not a text token (0 to {len(words) - 1})", quantity="position")
    frames = hearing.matrix.shape[1]
    row = heard.prompt - 1 + position  # the position that writes the token
    w = heard.cross_weights[:, :, row, :frames]
    rows, columns = hearing.path
    starts = columns[np.diff(rows, prepend=-1).astype(bool)] / FRAMES_PER_SECOND
    w = w / w.sum(-1, keepdims=True)
    return Listening(hearing.card, hearing.audio, hearing.seconds, hearing.text, hearing.tokens[position],
                     position, w, hearing.published, (float(starts[position]), float(starts[position + 1])),
                     hearing.loudness,
                     effect_of([b.cross for b in model.decoder.blocks], [heard.encoded[:frames]] * len(w), w)
                     if effect else None)


def effect_of(attentions: list, inputs: list, weights: np.ndarray) -> np.ndarray:
    """(layers, heads, frames): each layer's weights (layers, heads, frames) times the length of
    each frame's value (from that layer's `inputs`, (frames, D)) through the head's block of W_O,
    renormalised."""
    from mha_trace.core.effect import effect_weights, value_norms

    found = []
    for layer, (a, x) in enumerate(zip(attentions, inputs)):
        v = x @ a.W_v.weight.detach().double().cpu().numpy().T + a.W_v.bias.detach().double().cpu().numpy()
        norms = value_norms(v, a.W_o.weight.detach().double().cpu().numpy().T, a.heads, a.kv_heads)
        found.append(effect_weights(weights[layer][:, None], norms)[:, 0])
    return np.stack(found)


@dataclass
class CrossHeads(Shows):
    """`heads --model whisper --audio FILE [--head L.H]`: every cross-attention head at a glance,
    each a map of its weights, or one head; a row for each text token (the position that writes
    it) over the speech frames."""

    card: ModelCard
    audio: str
    seconds: float
    text: str
    tokens: tuple
    rows: np.ndarray  # (layers, heads, text, frames), each row summing to 1 over the speech
    published: tuple  # the model's own alignment heads, (layer, head) from 1
    head: tuple | None = None  # (layer, head) from 1: the one shown, or None for every head


def cross_heads(model: AudioModel, heard: "Heard", head: tuple | None = None) -> CrossHeads:
    hearing = hear(model, heard, timestamps=False)
    T, frames = len(hearing.tokens), hearing.matrix.shape[1]
    w = heard.cross_weights[:, :, heard.prompt - 1:heard.prompt - 1 + T, :frames].astype(np.float64)
    return CrossHeads(hearing.card, hearing.audio, hearing.seconds, hearing.text, hearing.tokens,
                      w / w.sum(-1, keepdims=True), hearing.published, head)


def speech_frames(heard) -> int:
    """The encoder frames that hold the audio (faster-whisper's content frames, halved)."""
    return int(round(heard.audio_seconds * 100)) // 2


def head_scores(heard) -> tuple[np.ndarray, np.ndarray]:
    """(disagreement, lag), each (layers, heads) in seconds. A head's disagreement: the median,
    over the other heads, of the mean |difference| between the times its own alignment path and
    theirs enter each token. Its lag: the median, over the text tokens, of its entry time less the
    median entry time of the half of the heads that disagree least."""
    L, H = heard.cross_weights.shape[:2]
    every = [(layer, head) for layer in range(1, L + 1) for head in range(1, H + 1)]
    rows, columns = dtw(-np.stack([alignment_matrix(heard, [h]) for h in every]))
    times = np.stack([entries(r, c) for r, c in zip(rows, columns)])  # (heads, text + 1)
    apart = np.abs(times[:, None] - times[None]).mean(-1)
    np.fill_diagonal(apart, np.nan)
    disagreement = np.nanmedian(apart, axis=1)
    following = np.argsort(disagreement, kind="stable")[:len(every) // 2]
    lag = np.median((times - np.median(times[following], axis=0))[:, 1:], axis=1)
    return disagreement.reshape(L, H), lag.reshape(L, H)


def entries(rows, columns) -> np.ndarray:
    """The time (s) the path enters each row."""
    return columns[np.diff(rows, prepend=-1).astype(bool)] / FRAMES_PER_SECOND


def median_filter(x: np.ndarray, width: int = MEDIAN_WIDTH) -> np.ndarray:
    """The median of each `width` neighbours along the last axis, the ends reflected."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1)


def dtw(cost: np.ndarray) -> tuple:
    """The cheapest monotone path through each cost matrix (..., N, M) from (0, 0) to (N-1, M-1),
    each step one row down, one column right or both (ties: right, as Whisper's): the rows and
    columns along each path. The cells of an anti-diagonal depend only on earlier ones, so each
    is filled at once, for every matrix together."""
    batch = cost.reshape(-1, *cost.shape[-2:])
    B, N, M = batch.shape
    total = np.full((B, N + 1, M + 1), np.inf)
    trace = np.full((B, N + 1, M + 1), 2, dtype=np.int8)
    trace[:, 1:, 0] = 1
    total[:, 0, 0] = 0
    for d in range(2, N + M + 1):
        i = np.arange(max(1, d - M), min(N, d - 1) + 1)
        j = d - i
        c0, c1, c2 = total[:, i - 1, j - 1], total[:, i - 1, j], total[:, i, j - 1]
        t = np.where((c0 < c1) & (c0 < c2), 0, np.where((c1 < c0) & (c1 < c2), 1, 2))
        total[:, i, j] = batch[:, i - 1, j - 1] + np.choose(t, [c0, c1, c2])
        trace[:, i, j] = t
    paths = [_back(trace[b], N, M) for b in range(B)]
    rows = [p[0] for p in paths]
    columns = [p[1] for p in paths]
    return (rows[0], columns[0]) if cost.ndim == 2 else (rows, columns)


def _back(trace, i, j) -> tuple:
    path = []
    while i > 0 or j > 0:
        path.append((i - 1, j - 1))
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    rows, columns = np.array(path[::-1]).T
    return rows, columns


def alignment_matrix(heard, heads) -> np.ndarray:
    """(text + 1, frames): the heads' weights from <|notimestamps|> to the last text token, over the
    speech, standardised per head over the tokens, median-filtered along time and averaged."""
    frames = speech_frames(heard)
    w = np.stack([heard.cross_weights[layer - 1, head - 1, heard.prompt - 1:, :frames]
                  for layer, head in heads]).astype(np.float64)
    w = w / w.sum(-1, keepdims=True)  # the softmax over the speech frames alone
    w = (w - w.mean(-2, keepdims=True)) / w.std(-2, keepdims=True)
    return median_filter(w).mean(0)


@dataclass
class Word:
    word: str
    tokens: tuple
    start: float
    end: float


def words_of(tokenizer, ids) -> list:
    """The text's words as Whisper splits them: a new word at a leading space or a punctuation mark."""
    words: list = []
    for i in ids:
        piece = tokenizer.decode([i])
        if not words or piece.startswith(" ") or piece.strip() in string.punctuation:
            words.append([piece, [i]])
        else:
            words[-1][0] += piece
            words[-1][1].append(i)
    return words


def word_timings(heard, tokenizer, heads) -> list:
    """Each word's start and end in seconds, from the heads' alignment path."""
    text = list(heard.ids[heard.prompt:])
    if not text:
        return []
    times = entries(*dtw(-alignment_matrix(heard, heads)))  # where the path enters each row
    words = words_of(tokenizer, text)
    bounds = np.cumsum([0] + [len(t) for _, t in words])
    found = [Word(w, tuple(t), float(times[a]), float(times[b]))
             for (w, t), a, b in zip(words, bounds[:-1], bounds[1:])]
    return _merged(_sentence_ends_kept_short(found))


def _sentence_ends_kept_short(words: list) -> list:
    """Whisper's hack: a word at a sentence boundary is no longer than twice the median word."""
    lengths = np.array([w.end - w.start for w in words])
    lengths = lengths[lengths.nonzero()]
    if not len(lengths):
        return words
    longest = min(0.7, float(np.median(lengths))) * 2
    for before, w in zip(words, words[1:]):
        if w.end - w.start > longest:
            if w.word in ".。!！?？":
                w.end = w.start + longest
            elif before.word in ".。!！?？":
                w.start = w.end - longest
    return words


def _merged(words: list) -> list:
    """Punctuation joins its word: an opening mark the next, a closing mark the one before."""
    i = len(words) - 2
    while i >= 0:
        if words[i].word.startswith(" ") and words[i].word.strip() in PREPENDED and words[i + 1].word:
            words[i + 1].word = words[i].word + words[i + 1].word
            words[i + 1].tokens = words[i].tokens + words[i + 1].tokens
            words[i].word, words[i].tokens = "", ()
        i -= 1
    i = 0
    while i < len(words) - 1:
        if not words[i].word.endswith(" ") and words[i + 1].word in APPENDED and words[i].word:
            words[i].word += words[i + 1].word
            words[i].tokens += words[i + 1].tokens
            words[i + 1].word, words[i + 1].tokens = "", ()
        i += 1
    return [w for w in words if w.word]
