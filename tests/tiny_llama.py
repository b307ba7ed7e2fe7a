"""A third model for the conformance test: a LLaMA-shaped decoder with random weights (RMSNorm,
RoPE, 4 query heads sharing 2 K/V heads, SwiGLU), a word-level tokenizer, and nothing else. It is
written against the model interface alone (mha_trace.models.base): what any new model gives the
views. Its blocks are the lecture's own MultiHeadAttention, as every model's are.
"""

import contextlib

import torch
import torch.nn as nn
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from mha_trace.core.attention import KVCache
from mha_trace.models.base import Capabilities, Limits
from mha_trace.models.registry import Entry
from mha_trace.models.sentence import Sentence, encode_all, rows_of
from mha_trace.models.smollm2 import Block, RMSNorm

WORDS = ("the cat sat on mat a dog ran to park it was tired because of and then saw big small "
         "red blue house tree bird flew away . ,").split()
ENTRY = Entry("tiny-llama", "tiny-llama (random weights)", lambda name: load_tiny(name), "",
              (0.0, 0.0001, 1e-7), 64, "a LLaMA-shaped decoder with random weights (a test's)")


class TinyLlama:
    name = "tiny-llama (random weights)"
    key = "tiny-llama"
    capabilities = Capabilities(causal=True, decodes=True, language_model=True, rope=True,
                                text=True, trained_run=False)
    limits = Limits()
    layers, heads, kv_heads, d_model, max_positions, rope_base = 2, 4, 2, 32, 128, 10000.0
    default_text = None  # its views read the chapter's sentence unless given one
    bos, eos = 1, 2

    def __init__(self, seed: int = 0):
        vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *WORDS])}
        self.tokenizer = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
        self.tokenizer.pre_tokenizer = Whitespace()
        self.vocab_size = len(vocab)
        torch.manual_seed(seed)
        self.blocks = nn.ModuleList(Block(self.d_model, self.heads, self.kv_heads, 64,
                                          self.rope_base, 1e-5) for _ in range(self.layers))
        self.norm = RMSNorm(self.d_model, 1e-5)
        self.embedding = nn.Embedding(self.vocab_size, self.d_model)
        for module in (self.blocks, self.norm, self.embedding):
            module.eval().requires_grad_(False)
        self.device = torch.device("cpu")

    def to(self, device):
        for module in (self.blocks, self.norm, self.embedding):
            module.to(device)
        self.device = torch.device(device)
        return self

    def resident(self):
        return contextlib.nullcontext(self)

    def pieces(self, text: str) -> tuple:
        from mha_trace.models.guards import check_sentence, check_tokens

        encoding = self.tokenizer.encode(check_sentence(text))
        ids = [self.bos, *encoding.ids]
        check_tokens(self, len(ids))
        return ids, tuple(self.token_text(i) for i in ids), (None, *encoding.word_ids)

    def tokenize(self, text: str) -> list[int]:
        return self.pieces(text)[0]

    def token_text(self, i: int) -> str:
        return self.tokenizer.id_to_token(i)

    def encode(self, text: str) -> Sentence:
        return encode_all(self, [text])[0]

    def run(self, ids, batch: int = 1, resume=None, grad: bool = False, last: int | None = None,
            mask=None, caches=None):
        rows = rows_of(ids)
        T = len(rows[0])
        first, x = (1, self.embedding(torch.tensor(rows, device=self.device))) if resume is None else resume
        x = x.expand(batch, T, self.d_model) if batch > 1 else x
        last = self.layers if last is None else last
        if mask is None:
            start = 0 if caches is None else caches[0].position
            mask = torch.ones(T, start + T, dtype=torch.bool, device=self.device).tril(start)
        inputs, weights = [], []
        with torch.set_grad_enabled(grad):
            for i in range(first - 1, last):
                inputs.append(x[:len(rows)].clone())
                x, _, w = self.blocks[i](x, mask, None if caches is None else caches[i])
                weights.append(w[:len(rows)].clone())
            x = self.norm(x) if last == self.layers else x
        return x, inputs, weights

    def generate(self, ids, count: int, on_token=lambda: None):
        caches = [KVCache() for _ in self.blocks]
        first = out = self.run(ids, caches=caches)[0]
        generated = []
        while len(generated) < count and len(ids) + len(generated) < self.max_positions:
            generated.append(int(torch.argmax(self.logits(out)[0])))
            on_token()
            out = self.run(generated[-1:], caches=caches)[0]
        return first, generated

    def logits(self, hidden):
        return self.unembed(hidden[:, -1])

    def logits_at(self, hidden, positions):
        return self.unembed(hidden[0, positions])

    def unembed(self, vectors, ids=None):
        rows = self.embedding.weight if ids is None else self.embedding.weight[list(ids)]
        return vectors @ rows.T  # tied, as SmolLM2's

    def attention_module(self, layer: int):
        return self.blocks[layer - 1].attention

    def attention_input(self, inputs: list, layer: int):
        with torch.no_grad():
            return self.blocks[layer - 1].attention_norm(inputs[layer - 1])

    def embedding_parts(self, ids) -> dict:
        return {"token": self.embedding(torch.tensor(list(ids), device=self.device))}

    def stream_steps(self, layer: int) -> list:
        return [] if layer == 0 else [self.blocks[layer - 1].attention, self.blocks[layer - 1].down]

    def attention_norm_of(self, layer: int):
        return self.blocks[layer - 1].attention_norm


_loaded = None


def load_tiny(name: str = "tiny-llama") -> TinyLlama:
    global _loaded
    _loaded = _loaded or TinyLlama()
    return _loaded
