"""Watch heads specialise: a tiny attention-only transformer, trained from scratch on a toy task.

The model is token and position embeddings, then layers of the lecture's own MultiHeadAttention
with a residual connection each (no MLP), then an unembedding: the two-layer attention-only
setting in which Olsson et al. 2022 watched induction heads form. Tasks are made on the fly from
a seeded generator. Every few steps (log-spaced, so the fast early change is seen) the run keeps
a snapshot: the loss, every head's weights on a fixed probe batch, the detector scores, and the
model's weights, so any view can look at any saved step.

Deterministic: one thread, seeded generators, the same bytes for the same options. Plain data;
the renderer draws it. Layers and heads are counted from 1.
"""

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from mha_trace.core.attention import MultiHeadAttention
from mha_trace.core.runtime import seed
from mha_trace.models.spec import Spec
from mha_trace.records import Shows

class Toy(nn.Module):
    """Embeddings, `layers` × (x + the lecture's attention(x), causal), unembedding; positions
    learned at the input, or (spec.rope) turned into q and k by RoPE."""

    def __init__(self, s: Spec):
        super().__init__()
        self.embed = nn.Embedding(s.vocab, s.d_model)
        self.position = None if s.rope else nn.Embedding(s.seq, s.d_model)  # RoPE: none learned
        self.blocks = nn.ModuleList(MultiHeadAttention(s.d_model, s.heads, rope=s.rope)
                                    for _ in range(s.layers))
        self.unembed = nn.Linear(s.d_model, s.vocab)

    def forward(self, ids):
        """(logits (B, T, V), each layer's input, each layer's weights (B, H, T, T))."""
        x, inputs, weights = self.layers_from(self.embedded(ids))
        return self.unembed(x), inputs, weights

    def embedded(self, ids) -> torch.Tensor:
        """(B, T, D): the token's vector plus its position's (with RoPE, the token's alone)."""
        x = self.embed(ids)
        return x if self.position is None else x + self.position.weight[:ids.size(1)]

    def layers_from(self, x, first: int = 1, last: int | None = None, keep: int | None = None,
                    mask=None, caches=None):
        """Layers `first` to `last` (from 1) on x, layer `first`'s input: (the residual stream after
        them, each one's input and weights, for the first `keep` rows). mask: in place of the
        causal one; caches: one per layer, every layer's (as SmolLM2's), when decoding (the KV-cache
        lab) or resuming after a shared prefix (patching)."""
        T = x.size(1)
        if mask is None:
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()  # causal
        inputs, weights = [], []
        for i, block in enumerate(self.blocks[first - 1:last]):
            inputs.append(x[:keep])
            attended, w = block(x, mask=mask, cache=None if caches is None else caches[first - 1 + i])
            x = x + attended
            weights.append(w[:keep])
        return x, inputs, weights


def make_identical(model: Toy) -> None:
    """Every head of a layer starts as its first head: its rows of W_q, W_k, W_v and its columns of
    W_o copied (exercise 3). The heads then get the same gradients, and stay the same."""
    with torch.no_grad():
        for block in model.blocks:
            d = block.d_k
            for h in range(1, block.heads):
                rows = slice(h * d, (h + 1) * d)
                for W in (block.W_q, block.W_k, block.W_v):
                    W.weight[rows] = W.weight[:d]
                    W.bias[rows] = W.bias[:d]
                block.W_o.weight[:, rows] = block.W_o.weight[:, :d]


def untrained_key_biases(model: Toy) -> None:
    """The key biases are not trained. q·b_k adds the same number to every key's score of a
    query, and the softmax is blind to that: the true gradient of b_k is zero, and what reaches it
    is rounding noise that AdamW (dividing by the gradient's own size) would turn into steps of
    the learning rate's size, different on every CPU. The weights never depend on b_k; the scores
    shown would, by a CPU's rounding."""
    for block in model.blocks:
        if block.W_k.bias is not None:
            block.W_k.bias.grad = None  # AdamW leaves a parameter without a gradient as it is


def batch(s: Spec, generator: torch.Generator, size: int | None = None):
    """(input ids (B, T), targets (B, T), scored (B, T) bool): one batch of the task."""
    B, T, V, n = size or s.batch, s.seq, s.vocab, s.seq // 2
    x = torch.randint(0, V, (B, T), generator=generator)
    y = torch.zeros_like(x)
    scored = torch.zeros(B, T, dtype=torch.bool)
    if s.task == "induction":
        # a segment of random length at a random place, then again right after: only its content
        # finds the earlier copy (a fixed distance could be learnt from the positions alone)
        for b in range(B):
            m = int(torch.randint(3, n + 1, (1,), generator=generator))
            start = int(torch.randint(0, T - 2 * m + 1, (1,), generator=generator))
            x[b, start + m:start + 2 * m] = x[b, start:start + m]
            scored[b, start + m:start + 2 * m - 1] = True  # the repeat's next tokens
        y[:, :-1] = x[:, 1:]
    elif s.task == "previous-token":
        y[:, 1:] = x[:, :-1]
        scored[:, 1:] = True
    elif s.task == "difference":
        y[:, 2:] = (x[:, 1:-1] - x[:, :-2]) % V
        scored[:, 2:] = True
    elif s.task == "copy":
        y[:, n:] = x[:, :n]
        scored[:, n:] = True
    else:  # reverse
        y[:, n:] = x[:, :n].flip(1)
        scored[:, n:] = True
    return x, y, scored


def loss_of(model: Toy, x, y, scored) -> torch.Tensor:
    logits, _, _ = model(x)
    return nn.functional.cross_entropy(logits[scored], y[scored])


def snapshot_steps(s: Spec) -> list[int]:
    """`snapshots` steps from 0 to the last, log-spaced: dense early, where the loss drops."""
    if s.snapshots < 2:
        return [s.steps]
    found = {0, s.steps} | {int(round(math.exp(math.log(s.steps + 1) * i / (s.snapshots - 1)))) - 1
                            for i in range(s.snapshots)}
    return sorted(k for k in found if 0 <= k <= s.steps)


def scores(weights: list, s: Spec) -> dict[str, np.ndarray]:
    """Detector scores (layers, heads) on the probe batch (the induction task's sequences):
    previous token, two back, and induction (the token after the earlier copy)."""
    from mha_trace.core.detectors import induction_scores

    w = torch.stack([x.detach() for x in weights], 1).double().mean(0).numpy()  # (L, H, T, T)
    q = np.arange(2, s.seq)  # queries with a key two back
    return {"previous token": w[..., q, q - 1].mean(-1), "two back": w[..., q, q - 2].mean(-1),
            "induction": induction_scores(w, s.seq // 2, start=0)}


@dataclass
class Snapshot:
    step: int  # updates made before it
    loss: float  # the loss on a held-out batch of the task then
    scores: dict  # detector -> (layers, heads)
    weights: np.ndarray  # (layers, heads, T, T) on the first probe sequence
    state: dict  # the model's weights then (tensors)


@dataclass
class Training(Shows):
    spec: Spec
    losses: list  # the training loss of every step's batch, before its update
    snapshots: list  # [Snapshot]
    probe: list  # the first probe sequence's token ids
    state: dict = field(default_factory=dict)  # to resume: model, optimiser and generator states

    @property
    def chance(self) -> float:
        return math.log(self.spec.vocab)

    def formed(self, detector: str, threshold: float = 0.5) -> dict:
        """(layer, head) -> the first snapshot step whose score is over the threshold."""
        found: dict = {}
        for snap in self.snapshots:
            for l, h in zip(*np.nonzero(snap.scores[detector] > threshold)):
                found.setdefault((int(l) + 1, int(h) + 1), snap.step)
        return found

    def k_partners(self) -> dict:
        """Each induction head (layer, head), as `formed` finds them -> at every snapshot (step,
        the earlier head whose output its keys read most, that K-composition score)."""
        from mha_trace.core.composition import factors, one_reader, pair_scores, readers, writers

        H, found = self.spec.heads, {head: list[tuple]() for head in self.formed("induction") if head[0] > 1}
        for snap in self.snapshots if found else []:
            model = Toy(self.spec)
            model.load_state_dict(snap.state)
            per_layer = [factors(block) for block in model.blocks]
            for (l, h), trail in found.items():
                written = np.concatenate([writers(f) for f in per_layer[:l - 1]])
                s = pair_scores(written, one_reader(readers(per_layer[l - 1])["K"], h - 1))[:, 0]
                best = int(np.argmax(s))
                trail.append((snap.step, (best // H + 1, best % H + 1), float(s[best])))
        return found

    def spread(self) -> np.ndarray:
        """(snapshots, layers): how far apart a layer's heads attend on the probe: for the two
        heads furthest apart, the share of a query's weight they put in different places (total
        variation, averaged over queries: 0 when the heads are the same, 1 when they never meet)."""
        out = np.zeros((len(self.snapshots), self.spec.layers))
        for i, snap in enumerate(self.snapshots):
            for l, w in enumerate(snap.weights):
                out[i, l] = max((0.5 * np.abs(w[a] - w[b]).sum(-1).mean() for a in range(len(w))
                                 for b in range(a + 1, len(w))), default=0.0)
        return out

    def identical(self) -> bool:
        """Whether every layer's heads have equal weights at every snapshot, to the last bit."""
        for snap in self.snapshots:
            for l in range(self.spec.layers):
                w = snap.weights[l]
                if not all(np.array_equal(w[0], w[h]) for h in range(1, len(w))):
                    return False
        return True


def probe_batch(s: Spec):
    """The fixed probe: 8 sequences of random tokens whose second half repeats the first."""
    g = torch.Generator().manual_seed((10_000 + s.seed) % 2 ** 64)
    x = torch.randint(0, s.vocab, (8, s.seq), generator=g)
    x[:, s.seq // 2:] = x[:, :s.seq // 2]
    return x


def run_training(s: Spec, on_step=lambda loss: None, resume: Training | None = None) -> Training:
    """Train from scratch (or on from `resume`'s last step) to `s.steps`; on_step(loss) each step."""
    from mha_trace.speedups import optimiser_without_dynamo

    with optimiser_without_dynamo():  # nothing is compiled: torch._dynamo is not imported
        return _train(s, on_step, resume)


def _train(s: Spec, on_step, resume) -> Training:
    s.check()
    seed(s.seed)
    model = Toy(s)
    if s.identical_heads:
        make_identical(model)
    optimiser = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=s.weight_decay)
    data = torch.Generator().manual_seed(s.seed)
    losses, snaps, start = [], [], 0
    if resume is not None:
        model.load_state_dict(resume.state["model"])
        optimiser.load_state_dict(resume.state["optimiser"])
        data.set_state(resume.state["generator"])
        losses, snaps, start = list(resume.losses), list(resume.snapshots), len(resume.losses)
    probe, held_out = probe_batch(s), batch(s, torch.Generator().manual_seed((20_000 + s.seed) % 2 ** 64), 64)
    wanted = set(snapshot_steps(s))
    for step in range(start, s.steps + 1):
        if step in wanted:
            snaps.append(_snapshot(model, probe, held_out, s, step))
        if step == s.steps:
            break
        x, y, scored = batch(s, data)
        loss = loss_of(model, x, y, scored)
        losses.append(loss.item())
        optimiser.zero_grad()
        loss.backward()
        untrained_key_biases(model)
        optimiser.step()
        on_step(losses[-1])
    state = {"model": {k: v.detach().clone() for k, v in model.state_dict().items()},
             "optimiser": optimiser.state_dict(), "generator": data.get_state()}
    return Training(s, losses, snaps, probe[0].tolist(), state)


def _snapshot(model: Toy, probe, held_out, s: Spec, step: int) -> Snapshot:
    """The model as it is before `step`'s update: its loss on a held-out batch of the task, and
    its heads on the probe."""
    with torch.no_grad():
        loss = float(loss_of(model, *held_out))
        _, _, weights = model(probe)
    return Snapshot(step, loss, scores(weights, s),
                    torch.stack([w[0] for w in weights]).double().numpy(),
                    {k: v.detach().clone() for k, v in model.state_dict().items()})
