"""Whisper's decoder reading what it wrote for one recording, as a text model: what `--attention
self` hands every text view (heads, explain, --why, --effect, shapes)."""

import contextlib

import torch

from mha_trace.models.base import Capabilities
from mha_trace.models.sentence import Sentence, encode_all, rows_of


class Transcript:
    """What Whisper wrote for one recording, as a text model (models.base.AttentionModel): the
    decoder over its own transcription, each layer's cross-attention reading that recording's
    encoder output. Every text view reads the decoder's self-attention through it: heads, explain,
    --why (the cross-attentions are sources of their own), --effect, shapes."""

    capabilities = Capabilities(causal=True, decodes=False, language_model=False, rope=False,
                                text=True, trained_run=False)
    kv_heads = None
    rope_base = None

    def __init__(self, whisper, heard):
        self.whisper, self.heard = whisper, heard
        self.name = f"{whisper.name}'s decoder"
        self.key, self.limits, self.device = whisper.key, whisper.limits, whisper.device
        self.layers, self.heads, self.d_model = whisper.layers, whisper.heads, whisper.d_model
        self.max_positions = whisper.max_positions
        self.default_text = heard.text.strip()  # the views read what it wrote
        self.blocks = whisper.decoder.blocks
        self._audio = torch.from_numpy(heard.encoded)[None].to(self.device)

    def to(self, device) -> "Transcript":
        self.whisper.to(device)
        self.device, self._audio = self.whisper.device, self._audio.to(device)
        return self

    def resident(self):
        return contextlib.nullcontext(self)

    def pieces(self, text: str) -> tuple:
        """(ids, tokens as they read, word of each token): the prompt, then what it wrote."""
        from mha_trace.errors import MhaError

        if text.strip() != self.default_text:
            raise MhaError(f"{self.name} reads what it wrote for the recording (\"{self.default_text}\"), "
                           f"not another text: leave out --sentence", quantity="sentence")
        h = self.heard
        words = [None] * h.prompt + [max(sum(t.startswith(" ") for t in h.tokens[h.prompt:i + 1]) - 1, 0)
                                     for i in range(h.prompt, len(h.ids))]
        return list(h.ids), tuple(self.token_text(i) for i in h.ids), tuple(words)

    def token_text(self, i: int) -> str:
        from mha_trace.errors import printable
        from mha_trace.io.units import WORD_START

        text = printable(self.whisper.tokenizer.decode([i], skip_special_tokens=False))
        return WORD_START + text[1:] if text.startswith(" ") else text

    def encode(self, text: str) -> Sentence:
        return encode_all(self, [text])[0]

    def run(self, ids, batch: int = 1, resume=None, grad: bool = False, last: int | None = None):
        """Every decoder layer in turn, as a text model's run: (output, each layer's input, each
        layer's self-attention weights); resume (layer, x) starts at that layer."""
        rows = rows_of(ids)
        d, T = self.whisper.decoder, len(rows[0])
        first, x = (1, d.embed[torch.tensor(rows, device=self.device)] + d.positions[:T]) \
            if resume is None else resume
        x = x.expand(batch, T, self.d_model) if batch > 1 else x
        last = self.layers if last is None else last
        mask = torch.ones(T, T, dtype=torch.bool, device=self.device).tril()
        audio = self._audio.expand(x.size(0), -1, -1)
        inputs, weights = [], []
        with torch.set_grad_enabled(grad):
            for i in range(first - 1, last):
                inputs.append(x[:len(rows)].clone())
                x, w, _ = self.blocks[i](x, audio, mask=mask)
                weights.append(w[:len(rows)].clone())
            x = d.norm(x) if last == self.layers else x
        return x, inputs, weights

    def attention_module(self, layer: int):
        return self.blocks[layer - 1].attention

    def attention_input(self, inputs: list, layer: int):
        with torch.no_grad():
            return self.blocks[layer - 1].attention_norm(inputs[layer - 1])

    # the residual stream by source (models.stream, `explain --why`): learned positions, and
    # each layer's cross-attention (what it heard) as a source beside its self-attention
    def embedding_parts(self, ids) -> dict:
        d = self.whisper.decoder
        return {"token": d.embed[torch.as_tensor(list(ids), device=self.device)],
                "position": d.positions[:len(ids)]}

    def stream_steps(self, layer: int) -> list:
        if layer == 0:
            return []
        block = self.blocks[layer - 1]
        return [block.attention, block.cross, block.mlp_out]

    def attention_norm_of(self, layer: int):
        return self.blocks[layer - 1].attention_norm


class UpToCross:
    """The decoder's stream up to layer `layer`'s cross-attention, for models.stream: its earlier
    layers whole, then that layer's self-attention, read through its cross-attention's norm.
    `stream_parts(UpToCross(t, L), ids, L + 1)` splits what that cross-attention's queries read."""

    def __init__(self, transcript: Transcript, layer: int):
        self.transcript, self.layer = transcript, layer

    def embedding_parts(self, ids) -> dict:
        return self.transcript.embedding_parts(ids)

    def stream_steps(self, layer: int) -> list:
        steps = self.transcript.stream_steps(layer)
        return steps if layer < self.layer else steps[:1]  # its self-attention, not what follows

    def run(self, ids, last: int):
        return self.transcript.run(ids, last=last)

    def attention_norm_of(self, layer: int):
        return self.transcript.blocks[self.layer - 1].cross_norm


class Sound:
    """The encoder's stream over one recording, for models.stream: the two convolutions' output
    and the sinusoidal positions, then each layer's attention and MLP. `stream_parts(Sound(whisper,
    samples), range(1500), L)` splits what encoder layer L's attention reads; with L one past the
    last layer, what every cross-attention's keys read (through the final norm)."""

    def __init__(self, whisper, samples):
        self.whisper, self.samples = whisper, samples
        self.encoder = whisper.encoder
        self.sound = whisper.sound(samples)[0]  # (1500, D)

    def embedding_parts(self, ids) -> dict:
        return {"sound": self.sound, "position": self.encoder.positions}

    def stream_steps(self, layer: int) -> list:
        block = self.encoder.blocks[layer - 1] if layer else None
        return [] if layer == 0 else [block.attention, block.mlp_out]

    def run(self, ids, last: int):
        """The encoder's layers up to `last`, run (not read from the model's kept pass): what
        each one adds is watched as it runs."""
        return self.whisper.run_encoder((self.sound + self.encoder.positions)[None], last)[-1]

    def attention_norm_of(self, layer: int):
        blocks = self.encoder.blocks
        return blocks[layer - 1].attention_norm if layer <= len(blocks) else self.encoder.norm
