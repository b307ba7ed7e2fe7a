"""The one ablation record: an output with some heads removed, against the full output, for the
lecture's module on a config (its one layer) and for a model's final vectors alike."""

from dataclasses import dataclass

import numpy as np

from mha_trace.records import Shows


@dataclass
class Ablation(Shows):
    source: object  # the full run: analysis.LectureHeads, or a model's text (models.base.ModelText)
    tokens: tuple
    removed: list  # [(layer, head)] from 1, sorted
    full: np.ndarray  # (T, D) the output with every head
    output: np.ndarray  # (T, D) with the removed heads zeroed before W_O
    next_full: np.ndarray | None = None  # causal models: next-token probabilities, every head
    next_ablated: np.ndarray | None = None  # ... and with the heads removed
    induction: tuple | None = None  # a trained run: (layers, heads) induction scores on its probe, (every head, without)
    words: dict | None = None  # causal models: token id -> how it reads, for the ids shown

    @property
    def distance(self) -> np.ndarray:
        """(T,) the L2 distance of each token's output from the full output."""
        return np.linalg.norm(self.output - self.full, axis=1)

    @property
    def relative(self) -> np.ndarray:
        """(T,) each token's distance over the norm of its full output."""
        return self.distance / np.linalg.norm(self.full, axis=1)

    @property
    def cosine(self) -> np.ndarray:
        """(T,) cosine similarity of each token's output with its full output."""
        norms = np.linalg.norm(self.output, axis=1) * np.linalg.norm(self.full, axis=1)
        return (self.output * self.full).sum(1) / norms

    @property
    def total(self) -> float:
        """The L2 norm of the whole difference."""
        return float(np.linalg.norm(self.output - self.full))

    @property
    def total_relative(self) -> float:
        """`total` over the L2 norm of the whole full output (nan when that is zero)."""
        norm = float(np.linalg.norm(self.full))
        return self.total / norm if norm else float("nan")

    @property
    def top(self) -> int:
        return int(np.argmax(self.next_full))

    @property
    def kl(self) -> float:
        """KL(full ‖ ablated) of the next-token distributions, in nats."""
        p, q = self.next_full, self.next_ablated
        keep = p > 0
        return float(np.sum(p[keep] * (np.log(p[keep]) - np.log(np.maximum(q[keep], 1e-45)))))
