"""`survey --composition`: Q-, K- and V-composition of every head with every head in an earlier
layer (`core.composition`), beside random matrices of the same shapes; for a trained run, the
heads its probe shows as previous-token and induction heads, and whom the induction heads read."""

from dataclasses import dataclass

import numpy as np

from mha_trace.core.composition import KINDS, factors, pair_scores, random_baseline, readers, writers
from mha_trace.errors import MhaError
from mha_trace.models.base import Decoder, ModelCard
from mha_trace.records import Shows

ROLE = 0.5  # a head has a role on the probe when it gives that place over half its weight


@dataclass
class Composition(Shows):
    model: object
    heads: list  # [(layer, head)] from 1, layer by layer
    scores: dict  # kind -> (heads, heads): writer rows, reader columns; NaN unless writer is earlier
    baseline: np.ndarray  # the scores of random matrices of the same shapes (draws,)
    roles: dict | None = None  # a trained run: "previous token" / "induction" -> (layers, heads)

    def partner(self, kind: str, reader: tuple) -> tuple[tuple, float]:
        """The earlier head whose output `reader` (layer, head) reads most, and its score."""
        column = self.scores[kind][:, self.heads.index(reader)]
        best = int(np.nanargmax(column))
        return self.heads[best], float(column[best])

    def strongest(self, kind: str, n: int) -> list[tuple]:
        """[(writer, reader, score)] the n largest of a kind, largest first: real pairs only (an
        earlier head and a later one), never more than there are."""
        s = self.scores[kind]
        ranked = np.argsort(-np.nan_to_num(s, nan=-1.0), axis=None, kind="stable")
        order = [i for i in ranked if not np.isnan(s.flat[i])][:n]
        return [(self.heads[i // len(self.heads)], self.heads[i % len(self.heads)], float(s.flat[i]))
                for i in order]

    def with_role(self, role: str) -> list:
        """The heads (layer, head) over ROLE on the probe for this role, best first."""
        if not self.roles:
            return []
        s = self.roles[role]
        found = [(float(s[l, h]), (int(l) + 1, int(h) + 1)) for l, h in zip(*np.nonzero(s > ROLE))]
        return [head for _, head in sorted(found, reverse=True)]


def head_factors(model, layer: int) -> dict:
    """One layer's heads as `core.composition.factors`, the norm it reads through folded in."""
    norm = model.attention_norm_of(layer)
    return factors(model.attention_module(layer), None if norm is None else norm.weight)


def composition(model: Decoder, on_layer=lambda: None) -> Composition:
    """Every pair (earlier head, later head) of a decoder: a layer of readers at a time."""
    if not model.capabilities.causal:
        raise MhaError(f"{model.name} normalises its stream after every layer (BERT's post-norm), "
                       f"so no head reads another's output as it was written; composition needs a "
                       f"decoder: --model smollm2 or --checkpoint run.pt", quantity="composition")
    if model.layers < 2:
        raise MhaError(f"{model.name} has one layer: no head has an earlier head to read "
                       f"(train one with --layers 2)", quantity="composition")
    per_layer = [head_factors(model, l) for l in range(1, model.layers + 1)]
    written = np.concatenate([writers(f) for f in per_layer])
    norms = np.linalg.norm(written, axis=(1, 2))
    written = written.astype(np.float32)  # the products' precision (`pair_scores`)
    heads = [(l, h) for l in range(1, model.layers + 1) for h in range(1, model.heads + 1)]
    found = {kind: np.full((len(heads), len(heads)), np.nan) for kind in KINDS}
    H = model.heads
    for l, f in enumerate(per_layer[1:], start=1):  # readers in layer l + 1
        read = readers(f)
        for kind in KINDS:
            found[kind][:l * H, l * H:(l + 1) * H] = pair_scores(written[:l * H], read[kind], norms[:l * H])
        on_layer()
    d_k = model.d_model // model.heads
    return Composition(ModelCard.of(model), heads, found, random_baseline(model.d_model, d_k),
                       probe_roles(model))


def probe_roles(model, removed: dict | None = None) -> dict | None:
    """A trained run: each head's previous-token and induction scores on its probe sequences
    (their second half repeats the first), with `removed` heads zeroed ({layer: [(None, head)]});
    None for other models."""
    if not model.capabilities.trained_run:
        return None
    from mha_trace.core.ablation import heads_zeroed
    from mha_trace.core.detectors import induction_scores, previous_token_scores

    ids = [model.tokenize(t) for t in model.probe_corpus.sentences]
    with heads_zeroed({model.attention_module(l): t for l, t in (removed or {}).items()}):
        _, _, weights = model.run(ids)
    w = np.stack([x.detach().double().cpu().numpy() for x in weights], 1).mean(0)  # (L, H, T, T)
    return {"previous token": previous_token_scores(w),
            "induction": induction_scores(w, w.shape[-1] // 2, start=0)}
