"""`survey --rope-planes`: how each head of a RoPE model divides |q·k| between the rotation planes
over a corpus, beside its previous-token score. Every head turns every plane (the frequency
belongs to a pair of dims); a head can only lean on some planes. Barbero et al. 2025 ("Round and
Round We Go! What makes Rotary Positional Encodings useful?") report that positional heads build
on the fastest planes and semantic ones on the slowest: this is the measurement on SmolLM2.
"""

from dataclasses import dataclass

import numpy as np

from mha_trace.core.ranks import spearman
from mha_trace.errors import MhaError
from mha_trace.models.base import AttentionModel, ModelCard
from mha_trace.records import Shows

BANDS = 4  # the planes in four bands of (near) equal size, fastest first (fewer when fewer planes)


@dataclass
class RopeShares(Shows):
    card: ModelCard
    corpus: str
    sentences: int
    frequencies: np.ndarray  # (planes,) θ_i, radians per token, fastest first
    shares: np.ndarray  # (layers, heads, planes): each plane's share of Σ|part| over the corpus
    previous: np.ndarray  # (layers, heads): the survey's previous-token score

    @property
    def rank_correlation(self) -> float | None:
        """Spearman's ρ over every head between the previous-token score and the fastest band's
        share; None with one head (nothing to rank)."""
        return spearman(self.previous, self.bands[..., 0])

    @property
    def band_planes(self) -> list[range]:
        """The planes of each band: BANDS bands of (near) equal size, or one a plane when a head
        has fewer planes (d_k = 2 has one)."""
        planes = self.shares.shape[-1]
        return [range(int(c[0]), int(c[-1]) + 1)
                for c in np.array_split(np.arange(planes), min(BANDS, planes))]

    @property
    def bands(self) -> np.ndarray:
        """(layers, heads, bands): the shares summed over each band's planes."""
        return np.add.reduceat(self.shares, [b.start for b in self.band_planes], axis=-1)


def rope_shares(model: AttentionModel, corpus, on_sentence=lambda: None) -> RopeShares:
    """Every head's |part| per plane, summed over each query and every key it sees in every
    sentence of the corpus, then as shares; and each head's previous-token score."""
    from mha_trace.analyses.model_analysis import check_lengths
    from mha_trace.core.detectors import detect, gather
    from mha_trace.models.sentence import encode_all
    from mha_trace.speedups import batch_work

    if not model.capabilities.rope:
        raise MhaError(f"{model.name} has no RoPE (its positions are added to the embeddings): "
                       f"--rope-planes needs a model that turns q and k, such as smollm2",
                       quantity="rope_planes")
    with model.resident(), batch_work():
        runs = encode_all(model, corpus.sentences, keep_inputs=True, on_sentence=on_sentence)
        check_lengths(runs)
        sums = np.sum([_plane_sizes(model, _stacked(group)) for group in _by_length(runs)], axis=0)
    previous = gather([detect(r.weights, r.tokens, r.ids, model.capabilities.causal)
                       for r in runs])["previous token"].mean
    first = model.attention_module(1)
    half = first.d_k // 2
    frequencies = first.rope_base ** (-np.arange(half) * 2.0 / first.d_k)
    return RopeShares(ModelCard.of(model), corpus.name, len(runs), frequencies,
                      sums / sums.sum(-1, keepdims=True), previous)


def _by_length(runs) -> list:
    """The sentences in groups of equal token length (each group one batch)."""
    groups: dict = {}
    for r in runs:
        groups.setdefault(len(r.tokens), []).append(r)
    return list(groups.values())


def _stacked(group) -> list:
    """Each layer's input of a group of equal-length sentences, as one batch (B, T, D)."""
    import torch

    return [torch.cat([r.inputs[i] for r in group]) for i in range(len(group[0].inputs))]


def _plane_sizes(model, inputs) -> np.ndarray:
    """(layers, heads, planes): Σ over the batch's sentences, their queries and the keys each
    sees of |q'·k'| in each plane."""
    import torch

    from mha_trace.core.attention import rope

    sizes = []
    with torch.no_grad():
        for layer in range(1, model.layers + 1):
            a = model.attention_module(layer)
            x = model.attention_input(inputs, layer).double()  # (B, T, D)
            B, T, half = x.size(0), x.size(1), a.d_k // 2
            Q = _linear(a.W_q, x).view(B, T, a.heads, a.d_k).transpose(1, 2)
            K = _linear(a.W_k, x).view(B, T, a.kv_heads, a.d_k).transpose(1, 2)
            Q, K = rope(Q, 0, a.rope_base), rope(K, 0, a.rope_base)
            K = K.repeat_interleave(a.heads // a.kv_heads, dim=1)  # (B, H, T, d_k)
            parts = (torch.einsum("bhqi,bhki->bhiqk", Q[..., :half], K[..., :half])
                     + torch.einsum("bhqi,bhki->bhiqk", Q[..., half:], K[..., half:]))
            seen = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # causal: a query sees keys up to itself
            sizes.append((parts.abs() * seen).sum((0, -2, -1)).cpu().numpy())  # (H, planes)
    return np.stack(sizes)


def _linear(layer, x):
    """The projection in float64, the model's own weights left as they are."""
    import torch.nn.functional as F

    bias = None if layer.bias is None else layer.bias.double()
    return F.linear(x, layer.weight.double(), bias)
