"""The model interface: what every model gives the analyses, and what it can do.

A model's layers run the lecture's own `MultiHeadAttention`, so every view reads any model through
these members alone. What differs between models is declared, never probed: `capabilities` says
whether a model is causal, decodes with a KV cache, predicts text, turns q and k with RoPE, reads
text through a tokenizer or is a run of `mha-trace train`. The conformance test
(tests/test_models_conform.py) checks every registered model against these protocols.
"""

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Capabilities:
    causal: bool  # a query sees only the keys before it (a decoder)
    decodes: bool  # runs token by token with a KV cache per layer (the cache lab)
    language_model: bool  # predicts the next token of text (predict, prune, --induction)
    rope: bool  # q and k turned by RoPE inside the attention (no position embedding)
    text: bool  # reads text through a tokenizer (False: token ids written out, "3 14 7")
    trained_run: bool  # a run of mha-trace train: saved steps, probe sequences, a task
    audio: bool = False  # hears audio (an encoder-decoder): its input is a recording, not text


@dataclass(frozen=True)
class Limits:
    """A call's guards, carried with the model of that call (never written on a shared one):
    --max-tokens raises the token guard, --max-seconds the time guard."""

    max_tokens: int | None = None  # None: the model's own (the registry's, else its context)
    max_seconds: float | None = None  # None: each guard's own limit

    def tokens(self, model) -> int:
        from mha_trace.models.registry import entry

        return self.max_tokens or entry(model.key).max_tokens or model.max_positions

    def seconds(self, default: float) -> float:
        return default if self.max_seconds is None else self.max_seconds


@dataclass(frozen=True)
class ModelCard:
    """What a record keeps of the model it came from: plain data. Records hold this, never the
    live model, so a renderer reads names and sizes and never calls the model."""

    name: str
    key: str
    layers: int
    heads: int
    kv_heads: int | None
    d_model: int
    capabilities: Capabilities
    rope_base: float | None = None
    vocab_size: int | None = None

    @classmethod
    def of(cls, model) -> "ModelCard":
        return cls(model.name, model.key, model.layers, model.heads, model.kv_heads, model.d_model,
                   model.capabilities, model.rope_base, getattr(model, "vocab_size", None))


@dataclass(frozen=True)
class ModelText:
    """A text as a record keeps it: the card of the model it went through, and the text."""

    model: ModelCard
    text: str

    @classmethod
    def of(cls, sentence) -> "ModelText":
        return cls(ModelCard.of(sentence.model), sentence.text)


@runtime_checkable
class AttentionModel(Protocol):
    """Every model: its sizes, its tokens, a pass through every layer, and each layer's parts."""

    name: str  # how users read it ("SmolLM2-135M-Instruct", "run.pt at step 600")
    key: str  # what the registry's loader takes back ("smollm2", "run.pt@600")
    capabilities: Capabilities
    layers: int
    heads: int
    kv_heads: int | None  # K/V heads when shared (grouped-query attention), else None
    d_model: int
    max_positions: int  # the longest sequence it reads
    default_text: str | None  # what its views read when given no text (None: the chapter's sentence)
    rope_base: float | None  # RoPE's base when capabilities.rope
    device: object  # torch.device
    limits: Limits  # the guards of the call that holds it (a loader's model: the defaults)

    def to(self, device) -> "AttentionModel": ...
    def resident(self): ...  # a context: weights kept between passes
    def pieces(self, text: str) -> tuple: ...  # (ids, tokens as they read, word of each token)
    def token_text(self, i: int) -> str: ...
    def encode(self, text: str): ...  # a models.sentence.Sentence
    def run(self, ids, batch: int = 1, resume=None, grad: bool = False, last: int | None = None): ...
    def attention_module(self, layer: int): ...  # the layer's MultiHeadAttention
    def attention_input(self, inputs: list, layer: int): ...  # what that attention reads
    def embedding_parts(self, ids) -> dict: ...  # the residual stream's sources at layer 0
    def stream_steps(self, layer: int) -> list: ...  # what changes the stream in a layer
    def attention_norm_of(self, layer: int): ...  # the norm the attention reads through


@runtime_checkable
class Decoder(AttentionModel, Protocol):
    """A causal model: token ids in, next-token logits out, decoding with a cache per layer."""

    vocab_size: int

    def run(self, ids, batch: int = 1, resume=None, grad: bool = False, last: int | None = None,
            mask=None, caches=None): ...  # mask: (T, T), or (rows, heads, T, T), in place of the
    # causal one (the KV-cache lab's); caches: one a layer, their `position` where ids start (a
    # tensor for the KV-cache lab, which gives `resume` and `mask`: read it only to make the causal
    # mask)
    def tokenize(self, text: str) -> list[int]: ...
    def logits(self, hidden): ...  # (B, V) at the last position
    def unembed(self, vectors, ids=None): ...  # (N, D) -> (N, V), or (N, len(ids)): those entries'


@runtime_checkable
class LanguageModel(Decoder, Protocol):
    """A decoder of text: greedy generation and its special tokens."""

    bos: int
    eos: int
    tokenizer: Any  # a tokenizers.Tokenizer

    def generate(self, ids, count: int, on_token=lambda: None): ...
    def logits_at(self, hidden, positions): ...


@runtime_checkable
class AudioModel(Protocol):
    """An encoder-decoder that hears audio (Whisper): the encoder reads the sound, the decoder
    writes text, each decoder layer's cross-attention looking from a text token at the frames."""

    name: str
    key: str
    capabilities: Capabilities
    layers: int  # decoder layers (each with a self- and a cross-attention)
    encoder_layers: int
    heads: int
    d_model: int
    device: Any  # a torch.device
    limits: Limits
    alignment_heads: tuple  # the published (layer, head) pairs, 1-based: only to compare with
    tokenizer: Any  # a tokenizers.Tokenizer
    encoder: Any  # the encoder's blocks (an nn.ModuleList), each the lecture's attention
    decoder: Any  # the decoder's blocks, each a self- and a cross-attention

    def to(self, device) -> "AudioModel": ...
    def resident(self): ...
    def encode_audio(self, samples): ...  # (1, frames, D) the encoder's output
    def encoder_attention_input(self, samples, layer: int): ...  # (1, frames, D) what its attention reads
    def encoder_weights(self, samples, frames: int) -> tuple: ...  # every encoder head's weights
    def decode(self, ids, audio, caches=None): ...  # the decoder over ids, reading the encoded audio
    def transcribe(self, samples): ...  # greedy decoding: a models.whisper.Heard
    def heard_file(self, path): ...  # a WAV file read and transcribed, once a file: its samples, what it heard
    def reading(self, heard): ...  # the decoder over what it wrote (models.transcript.Transcript, a text model)


@runtime_checkable
class TrainedRun(Decoder, Protocol):
    """A run of mha-trace train at one saved step."""

    path: str
    step: int
    saved_steps: list
    default_text: str  # its first probe sequence
    probe_corpus: object  # a models.corpus.Corpus of its probe sequences
    spec: object  # the run's training.Spec (its task)
