"""`explain --model whisper --audio FILE --token WORD --head L.H --why`: why one cross-attention head's
query (the position that writes the word) weighs each frame of the sound as it does; with
`--attention encoder --token 1.9s`, why one encoder head's query (that frame) does.

A score is q · k_j / √d_k, q from the text's residual stream and k_j from the sound's. Both split
exactly by source (models.stream, norms frozen): q into the token and position embeddings, each
earlier decoder layer's attention, cross-attention and MLP, this layer's self-attention and the
biases; each k_j into the convolutions' output (the sound), the encoder's positions, each encoder
layer's attention and MLP and the biases. So the score is a sum of one term per (text source, sound
source) pair, each term shared half and half (analyses.why's `Why`, its sources the two lists
side by side); "without" a source takes its terms out of every frame's score and the softmax
again, over all 1,500 frames as the model takes it. In the encoder, q and k both come from the
sound's stream up to that layer: one list of sources on both sides, as a text model's `--why`.
"""

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mha_trace.models.whisper import Heard

from mha_trace.analyses.alignment import FRAMES_PER_SECOND, listen
from mha_trace.analyses.why import Why, projected
from mha_trace.models.base import ModelCard, AudioModel
from mha_trace.records import Shows

SOUND = "sound: "  # how the sound's sources are named beside the text's


@dataclass
class FrameWhy(Shows):
    """One head's scores over the frames for one query (a text token's in a cross-attention head,
    a frame's in an encoder head), split by where q and k come from."""

    card: ModelCard
    audio: str
    seconds: float
    text: str
    token: str  # the text token, or the frame's time ("1.90 s")
    index: int  # among the text tokens, or the speech frames, from 0
    head: tuple  # (layer, head) from 1
    published: bool
    why: Why  # over all 1,500 frames; sources: the text's, then the sound's ("sound: ...")
    frames: int  # how many of them hold the speech
    encoder: bool = False  # an encoder head: the query is a frame, q and k from the sound alone

    def peak(self, weights: np.ndarray) -> float:
        return float(np.argmax(weights) / FRAMES_PER_SECOND)


def cross_why(model: AudioModel, heard: "Heard", token: str | None, position: int | None, head: tuple) -> FrameWhy:
    import torch

    from mha_trace.models.stream import stream_parts
    from mha_trace.models.transcript import Sound, UpToCross

    listening = listen(model, heard, token, position)  # the token's place, and what was heard
    transcript = model.reading(heard)
    ids, layer = list(transcript.heard.ids), head[0]
    row = transcript.heard.prompt - 1 + listening.index  # the position that writes the token
    text = stream_parts(UpToCross(transcript, layer), ids, layer + 1)
    sound = stream_parts(Sound(model, heard.samples), list(range(len(transcript.heard.encoded))),
                         model.encoder_layers + 1)
    a = transcript.blocks[layer - 1].cross
    d, names = a.d_k, list(text) + [SOUND + n for n in sound]
    rows = slice((head[1] - 1) * d, head[1] * d)
    with torch.no_grad():  # each side's norms put a "biases" source in it, the projection's bias too
        q = projected(a.W_q, torch.stack([p[row:row + 1] for p in text.values()]), rows, list(text))
        k = projected(a.W_k, torch.stack(list(sound.values())), rows, list(sound))  # (Sk, frames, d)
        terms = torch.einsum("sd,tjd->stj", q[:, 0], k) / math.sqrt(d)  # (Sq, Sk, frames)
    Sq = len(text)
    pairs = np.zeros((len(names), len(names), terms.shape[-1]))
    pairs[:Sq, Sq:] = terms.cpu().numpy()
    why = Why(head[1], names, pairs, pairs.sum((0, 1)), np.ones(terms.shape[-1], bool))
    return FrameWhy(listening.card, listening.audio, listening.seconds, listening.text, listening.token,
                    listening.index, head, head in listening.published, why, listening.weights.shape[-1])


def encoder_why(model: AudioModel, heard: "Heard", at: str | None, position: int | None, head: tuple) -> FrameWhy:
    """An encoder head's scores for one frame (a time, or `position` among the speech frames)."""
    import torch

    from mha_trace.analyses.encoder import listen_frame
    from mha_trace.models.stream import stream_parts
    from mha_trace.models.transcript import Sound

    frame = listen_frame(model, heard, at, position)
    parts = stream_parts(Sound(model, heard.samples), list(range(len(heard.encoded))),
                         head[0])
    a = model.encoder.blocks[head[0] - 1].attention
    d, names = a.d_k, list(parts)
    rows = slice((head[1] - 1) * d, head[1] * d)
    with torch.no_grad():
        X = torch.stack(list(parts.values()))  # (S, 1500, D)
        q = projected(a.W_q, X[:, frame.index:frame.index + 1], rows, names)[:, 0]
        k = projected(a.W_k, X, rows, names)
        pairs = (torch.einsum("sd,tjd->stj", q, k) / math.sqrt(d)).cpu().numpy()
    why = Why(head[1], names, pairs, pairs.sum((0, 1)), np.ones(pairs.shape[-1], bool))
    return FrameWhy(frame.card, frame.audio, frame.seconds, frame.text, frame.token, frame.index, head,
                    False, why, frame.weights.shape[-1], encoder=True)
