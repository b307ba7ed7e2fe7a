"""One sentence through a pretrained model: what every view of a model reads."""

from dataclasses import dataclass

import numpy as np

@dataclass
class Sentence:
    """One sentence through the model: its tokens, every layer's input and weights, the output."""

    model: object
    text: str
    ids: tuple
    tokens: tuple  # WordPiece pieces as the model sees them ("##" kept)
    words: tuple  # the word each token belongs to (None for [CLS] and [SEP])
    inputs: list  # per layer: its input (1, T, D)
    weights: np.ndarray  # (layers, heads, T, T)
    output: np.ndarray  # (T, D): the final hidden states

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
