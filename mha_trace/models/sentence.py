"""One sentence through a pretrained model: what every view of a model reads."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from mha_trace.models.base import AttentionModel

# a batch of sentences holds about this many tokens: enough to keep the matrix products busy
BATCH_TOKENS = 1024

@dataclass
class Sentence:
    """One sentence through the model: its tokens, every layer's input and weights, the output."""

    model: "AttentionModel"
    text: str
    ids: tuple
    tokens: tuple  # WordPiece pieces as the model sees them ("##" kept)
    words: tuple  # the word each token belongs to (None for [CLS] and [SEP])
    inputs: list | None  # per layer: the residual stream entering it (1, T, D); None when not kept
    weights: np.ndarray  # (layers, heads, T, T)
    output: np.ndarray  # (T, D): the final hidden states
    effect: np.ndarray | None = None  # (layers, heads, T, T) effect weights, when asked for

    def __post_init__(self):
        # what a sentence shows comes from a user or a model: never raw control characters
        from mha_trace.errors import printable

        self.text = printable(self.text)
        self.tokens = tuple(printable(t) for t in self.tokens)

    @property
    def labels(self) -> tuple:
        """Tokens as tables show them: a repeated token carries its position (the·1, the·5)."""
        seen = [t for t in self.tokens]
        return tuple(f"{t}·{i}" if seen.count(t) > 1 else t for i, t in enumerate(seen))


def rows_of(ids) -> list:
    """One sentence's token ids, or several sentences' of equal length, as a list of rows."""
    return [list(r) for r in ids] if len(ids) and isinstance(ids[0], (list, tuple)) else [list(ids)]


def equal_lengths(lengths: list[int], tokens: int = BATCH_TOKENS) -> list[list[int]]:
    """Indices of items grouped by length, shortest first, in chunks of about `tokens` tokens:
    items of one chunk run together without padding."""
    by_length: dict = {}
    for i, n in enumerate(lengths):
        by_length.setdefault(n, []).append(i)
    chunks = []
    for n, members in sorted(by_length.items()):
        size = max(1, tokens // n)
        chunks += [members[k:k + size] for k in range(0, len(members), size)]
    return chunks


def encode_all(model, texts: list[str], keep_inputs: bool = True, effect: bool = False,
               on_sentence=lambda: None) -> list[Sentence]:
    """Each text through the model, as one Sentence each. Texts of equal token length run
    together in batches (no padding, so each sentence's numbers are those it gets alone);
    `on_sentence()` once for each sentence of a batch when the batch is done. keep_inputs=False
    drops every layer's input (a survey reads only the weights: SmolLM2 keeps 69 KB a token
    otherwise); effect=True keeps every layer's effect weights (`effects`)."""
    import torch

    pieces = [model.pieces(t) for t in texts]
    found: list = [None] * len(texts)
    for chunk in equal_lengths([len(ids) for ids, _, _ in pieces]):
        out, inputs, weights = model.run([pieces[i][0] for i in chunk])
        weights = torch.stack(weights, 1).cpu().numpy()  # (B, layers, heads, T, T)
        moved = effects(model, inputs, weights) if effect else [None] * len(chunk)
        for row, i in enumerate(chunk):
            ids, tokens, words = pieces[i]
            kept = [x[row:row + 1] for x in inputs] if keep_inputs else None
            found[i] = Sentence(model, texts[i], tuple(ids), tokens, words, kept,
                                weights[row], out[row].cpu().numpy(), moved[row])
            on_sentence()
    return found


def effects(model, inputs: list, weights: np.ndarray) -> np.ndarray:
    """(B, layers, heads, T, T): the effect weights of a batch (`core.effect`), from each layer's
    input (B, T, D) and its weights (B, layers, heads, T, T): every head's value vectors, bias
    included, through its block of W_O."""
    import torch

    from mha_trace.core.effect import effect_weights, value_norms

    norms = []
    with torch.no_grad():
        for layer in range(1, model.layers + 1):
            a = model.attention_module(layer)
            v = a.W_v(model.attention_input(inputs, layer)).double().cpu().numpy()
            W_O = a.W_o.weight.detach().double().cpu().numpy().T  # output = concat @ W_O
            norms.append(value_norms(v, W_O, model.heads, model.kv_heads or model.heads))
    return effect_weights(weights, np.stack(norms, 1))
