"""Whisper's encoder listening to itself (`--attention encoder`): every frame of the sound looks at
every frame, in each of the encoder's self-attention heads. The views show the speech's frames
(the first `speech_frames`), each frame's weights renormalised over them, with the share the 30 s
pass puts on the speech."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mha_trace.models.whisper import Heard

from mha_trace.analyses.alignment import FRAMES_PER_SECOND, Listening, effect_of, hear
from mha_trace.models.base import ModelCard, AudioModel
from mha_trace.records import Shows


@dataclass
class EncoderHeads(Shows):
    """`heads --model whisper --audio FILE --attention encoder [--head L.H]`: the encoder's
    self-attention among the speech frames, every head or one."""

    card: ModelCard
    audio: str
    seconds: float
    text: str
    rows: np.ndarray  # (layers, heads, frames, frames): each frame's weights over the speech, summing to 1
    kept: np.ndarray  # (layers, heads): the mean share of a speech frame's weight on the speech
    head: tuple | None = None  # (layer, head) from 1: the one shown, or None for every head


def encoder_heads(model: AudioModel, heard: "Heard", head: tuple | None = None) -> EncoderHeads:
    hearing = hear(model, heard, timestamps=False)
    w = model.encoder_weights(heard.samples, hearing.matrix.shape[1])[0].astype(np.float64)
    kept = w.sum(-1)  # what stays on the speech; the rest goes to the silence after it
    return EncoderHeads(hearing.card, hearing.audio, hearing.seconds, hearing.text,
                        w / kept[..., None], kept.mean(-1), head)


def listen_frame(model: AudioModel, heard: "Heard", at: str | None, position: int | None, effect: bool = False) -> Listening:
    """One frame (at a time in seconds, "1.2" or "1.2s", or `position` among the speech frames)
    through every encoder head: where it listens among the speech frames; effect=True weighs each
    frame by the length of what its value moves through the head's block of W_O."""
    from mha_trace.errors import MhaError
    hearing = hear(model, heard, timestamps=False)
    frames = hearing.matrix.shape[1]
    if position is None:
        try:
            position = round(float((at or "0").strip().removesuffix("s")) * FRAMES_PER_SECOND)
        except ValueError:
            raise MhaError(f"with --attention encoder, --token is a time in the speech (e.g. 1.2 or "
                           f"1.2s), not {at!r}", quantity="token") from None
    if not 0 <= position < frames:
        raise MhaError(f"frame {position} is not in the speech (0 to {frames - 1}: 0 to "
                       f"{(frames - 1) / FRAMES_PER_SECOND:.2f} s)", quantity="position")
    samples = heard.samples
    w, inputs = model.encoder_weights(samples, frames)
    row = w[:, :, position].astype(np.float64)
    row /= row.sum(-1, keepdims=True)
    t = position / FRAMES_PER_SECOND
    return Listening(hearing.card, hearing.audio, hearing.seconds, hearing.text, f"{t:.2f} s", position, row,
                     (), (t, t + 1 / FRAMES_PER_SECOND), hearing.loudness,
                     effect_of([b.attention for b in model.encoder.blocks], inputs, row) if effect else None,
                     encoder=True)
