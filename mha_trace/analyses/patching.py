"""Activation patching (`mha-trace patch`): run a clean and a corrupted text of the same length,
copy one activation from one run into the other, and measure how much of the metric's gap it
carries. Two grids: the residual stream entering each layer at each position (coarse: where the
information is), and each head's output at every position (which heads carry it). Denoising
copies clean into the corrupted run (the fraction restored); noising copies corrupted into the
clean run (the fraction destroyed); `by_input` adds each head's queries and each K/V group's keys
and values, `by_position` one head a position at a time. Plain data; the copies, one a patch, run
in one pass that each layer's copies join when it reaches that layer, from the first position
where the texts differ. Path patching is in `path_patching`.
"""

import contextlib
from dataclasses import dataclass

import numpy as np

from mha_trace.analyses.patch_inputs import (Metric, Run, capture, check_metric, check_patchable,
                                             metric_tensor, texts_of)
from mha_trace.core.ranks import spearman
from mha_trace.errors import MhaError
from mha_trace.models.base import Decoder, ModelCard
from mha_trace.models.guards import check_time
from mha_trace.records import Shows
from mha_trace.speedups import batch_work


@dataclass
class Patching(Shows):
    card: ModelCard
    clean: tuple  # the clean text's tokens
    corrupt: tuple  # the corrupted text's tokens
    metric: str
    noising: bool
    clean_value: float
    corrupt_value: float
    residual: np.ndarray  # (layers, positions): the metric with that residual entry patched
    heads: np.ndarray  # (layers, heads): the metric with that head's output patched
    attribution: np.ndarray  # (layers, heads): the same, estimated from one backward pass
    queries: np.ndarray | None = None  # (layers, heads): each head's queries patched (by_input)
    kv_groups: np.ndarray | None = None  # (layers, K/V heads): each group's keys and values
    by_position: tuple | None = None  # ((layer, head), (positions,)): that head, one position a copy

    @property
    def rank_correlation(self) -> float | None:
        """Spearman's ρ over the heads between the exact patches and their attribution estimates;
        None with one head (nothing to rank) or no gap (no shares to rank)."""
        return None if self.undefined else spearman(self.heads, self.attribution)

    @property
    def undefined(self) -> str | None:
        """Why no share of the gap is defined (the two runs score the same), else None."""
        if self.clean_value == self.corrupt_value:
            return "the two runs score the same: there is no gap to take a share of"
        return None

    def fraction(self, values: np.ndarray) -> np.ndarray:
        return share(values, self.clean_value, self.corrupt_value, self.noising)


def share(values: np.ndarray, clean: float, corrupt: float, noising: bool) -> np.ndarray:
    """Denoising: the share of the clean − corrupt gap a patch restores; noising: the share it
    destroys. Undefined (NaN, which every output says in words or null) where the gap is 0."""
    gap = clean - corrupt
    if gap == 0:
        return np.full(np.shape(values), np.nan)
    return (values - (clean if noising else corrupt)) / gap * (-1 if noising else 1)


def patch(model: Decoder, clean: str, corrupt: str, metric: Metric, noising: bool = False,
          on_layer=lambda: None, by_input: bool = False, by_position: tuple | None = None) -> Patching:
    """Both grids: every layer's residual input at every position, and every head's output, each
    patched alone from the source run (clean when denoising) into the target run. by_input: also
    each head's query and each K/V group's keys and values; by_position (layer, head): that
    head's output one position at a time."""
    import torch

    from mha_trace.runs.model_options import check_heads

    check_patchable(model)
    if by_position is not None:
        check_heads(model, [by_position], "by_position")
    (clean_ids, clean_tokens, _), (corrupt_ids, corrupt_tokens, _) = texts_of(model, clean, corrupt)
    if metric.kind == "induction":
        raise MhaError("metric induction scores one receiving head: give --sender and --receiver "
                       "(path patching)", quantity="metric")
    if len(clean_ids) != len(corrupt_ids):
        raise MhaError(f"the clean and the corrupted text must be the same length in tokens to "
                       f"patch position by position: {len(clean_ids)} and {len(corrupt_ids)}",
                       quantity="corrupt")
    start = next((t for t, (a, b) in enumerate(zip(clean_ids, corrupt_ids)) if a != b), len(clean_ids))
    check_time(model, len(clean_ids), patch_copies(model, len(clean_ids), by_input, start,
                                                   metric.kind == "loss"), "patch", "clean")
    targets = check_metric(metric, clean_ids, corrupt_ids)
    source_ids, target_ids = (corrupt_ids, clean_ids) if noising else (clean_ids, corrupt_ids)
    with model.resident(), batch_work(), torch.no_grad():  # every core for the copies
        source, target = capture(model, source_ids), capture(model, target_ids)
        values = [metric(model, run.hidden, targets)[0] for run in
                  ((target, source) if noising else (source, target))]
        base = values[0 if noising else 1]
        attribution = _attribution(model, target_ids, source.contexts, metric, targets, base)
        copies = _Copies(model, target_ids, source_ids, source, target, metric, targets)
        plan = {layer: copies.edits(layer, by_input, by_position) for layer in range(1, model.layers + 1)}
        found = copies.run({layer: [e for kind in kinds.values() for e in kind] for layer, kinds in plan.items()},
                           on_layer)
        grids: dict[str, list] = {kind: [] for kind in ("residual", "heads", "queries", "kv_groups", "by_position")}
        for layer, kinds in plan.items():
            at = 0
            for kind, edits in kinds.items():
                grids[kind].append(found[layer][at:at + len(edits)])
                at += len(edits)
        fill = lambda row: np.concatenate([np.full(copies.start, base), row])  # before: nothing moves
        positions = None if by_position is None else (tuple(by_position), fill(grids["by_position"][0]))
        grids["residual"] = [fill(row) for row in grids["residual"]]
    return Patching(ModelCard.of(model), tuple(clean_tokens), tuple(corrupt_tokens), metric.label,
                    noising, float(values[0]), float(values[1]), np.array(grids["residual"]),
                    np.array(grids["heads"]), attribution,
                    np.array(grids["queries"]) if by_input else None,
                    np.array(grids["kv_groups"]) if by_input else None, positions)


COPY_TOKENS = 16384  # copies × tokens in one pass at most (SmolLM2: about 100 MB a feed-forward)
BATCHED = 0.4  # a batch of copies costs about this share of running them one by one (2 cores)
LOSS = 1.7  # the loss unembeds every shared position of every copy: about this much more


def patch_copies(model, tokens: int, by_input: bool = False, start: int = 0, loss: bool = False) -> int:
    """Whole passes' worth of copies a patch runs: a batch of (tokens + heads) copies a layer
    (by_input: heads + K/V groups more), each from its layer to the last (half the layers on
    average) over the tokens from the first that differs (`start`), at the batched rate."""
    extra = model.heads + (model.kv_heads or model.heads) if by_input else 0
    copies = (tokens - start + model.heads + extra) * (model.layers + 1) / 2
    return max(1, round(BATCHED * copies * (tokens - start) / tokens * (LOSS if loss else 1)))


def _attribution(model, ids, source_contexts, metric, targets, base: float) -> np.ndarray:
    """Attribution patching (Nanda 2023): each head's patch estimated to first order, the metric's
    gradient at the target run (one backward pass) times the head's change of output:
    base + Σ (source − target) · ∂metric/∂output over the head's slice and every position."""
    import torch

    probes, hooks = [], []

    def add_probe(_, args):  # a zero added to the W_o input: its gradient is the context's,
        probe = torch.zeros_like(args[0], requires_grad=True)  # every path through later layers kept
        probes.append((probe, args[0].detach()))
        return (args[0] + probe,)

    for layer in range(1, model.layers + 1):
        hooks.append(model.attention_module(layer).W_o.register_forward_pre_hook(add_probe))
    try:
        with torch.enable_grad():
            hidden, _, _ = model.run(ids, grad=True)
            metric_tensor(model, metric, hidden, targets).backward()
    finally:
        for hook in hooks:
            hook.remove()
    rows = []
    for layer, (probe, context) in enumerate(probes, 1):
        attention = model.attention_module(layer)
        change = ((source_contexts[layer - 1] - context) * probe.grad)[0].sum(0)  # (H·d_k,)
        rows.append(base + change.view(attention.heads, attention.d_k).sum(-1).double().cpu().numpy())
    return np.array(rows)


class _Copies:
    """Batches of copies of the target run, each with one activation taken from the source run,
    resumed at the patched layer. Before the first position where the texts differ both runs
    are the same (a causal model): the copies start there, reading that prefix's keys and values
    from a cache, and a patch before it changes nothing."""

    def __init__(self, model, ids, source_ids, source: Run, target: Run, metric, targets: dict):
        from mha_trace.core.attention import KVCache

        self.model, self.ids, self.source, self.target = model, ids, source, target
        self.metric, self.targets = metric, targets
        self.start = next((t for t, (a, b) in enumerate(zip(source_ids, ids)) if a != b), len(ids))
        self.prefix = None
        if 0 < self.start < len(ids):
            self.prefix = [KVCache() for _ in range(model.layers)]
            model.run(ids[:self.start], caches=self.prefix)

    def edits(self, layer: int, by_input: bool, by_position: tuple | None) -> dict:
        """A layer's copies, by grid: the residual stream entering it at each position from the
        first that differs, each head's output, (by_input) each head's queries and each K/V group's
        keys and values, (by_position at this layer) that head at each position alone."""
        T, H = len(self.ids), self.model.heads
        edits = {"residual": [("residual", t) for t in range(self.start, T)],
                 "heads": [("head", h, None) for h in range(H)]}
        if by_input:
            edits |= {"queries": [("q", h) for h in range(H)],
                      "kv_groups": [("kv", g) for g in range(self.model.kv_heads or H)]}
        if by_position is not None and by_position[0] == layer:
            edits["by_position"] = [("head", by_position[1] - 1, t) for t in range(self.start, T)]
        return edits

    def run(self, plan: dict, on_layer=lambda: None) -> dict:
        """The metric of one copy per edit (layer -> edits: ("residual", t), ("head", h, t or None:
        every position), ("q", h) one head's queries, ("kv", g) one K/V group's keys and values).
        A layer's copies join the batch when the pass reaches that layer, so the copies of many
        layers share one pass; a new pass starts where the batch would outgrow COPY_TOKENS."""
        found, group, tokens = dict[tuple, float](), list[tuple](), len(self.ids) - self.start
        if tokens == 0:  # the same text twice: every copy is the target run
            same = self.metric(self.model, self.target.hidden, self.targets)[0]
            return {layer: np.full(len(edits), same) for layer, edits in plan.items()}
        for layer in plan:
            if group and (sum(len(plan[g]) for g in group) + len(plan[layer])) * tokens > COPY_TOKENS:
                found |= self._pass(group, plan, on_layer)
                group = []
            group.append(layer)
        return found | self._pass(group, plan, on_layer)

    def _pass(self, group: list, plan: dict, on_layer) -> dict:
        """One pass from the group's first layer to the last, each group layer's copies added."""
        import torch

        model, s, x, spans = self.model, self.start, None, {}
        T = len(self.ids) - s
        mask = torch.ones(T, s + T, dtype=torch.bool, device=self.target.hidden.device).tril(s)
        for layer in range(group[0], model.layers + 1):
            if layer in group:
                at = 0 if x is None else x.size(0)
                new, cuts = self._copies(layer, plan[layer], at)
                spans[layer] = (at, at + new.size(0))
                x = new if x is None else torch.cat([x, new])
            with self._hooked(layer, cuts if layer in group else {}):
                caches = None if self.prefix is None else [_expanded(c, x.size(0)) for c in self.prefix]
                x, _, _ = model.run(self.ids[s:], batch=x.size(0), resume=(layer, x), caches=caches,
                                    mask=mask, last=layer)
            if layer in group:
                on_layer()
        whole = torch.cat([self.target.hidden[:, :s].expand(x.size(0), -1, -1), x], dim=1)
        values = self.metric(model, whole, self.targets)
        return {layer: values[a:b] for layer, (a, b) in spans.items()}

    def _copies(self, layer: int, edits: list, at: int) -> tuple:
        """The copies of the target run's input to `layer` from the first differing position, each
        residual edit made; and what the hooks take from the source: name -> [(copy, columns,
        rows)], copies counted from `at`."""
        s, d = self.start, self.model.attention_module(layer).d_k
        x = self.target.inputs[layer - 1][:, s:].expand(len(edits), -1, -1).clone()  # (copies, T − s, D)
        cuts: dict[str, list] = {"context": [], "q": [], "k": [], "v": []}
        for i, edit in enumerate(edits):
            if edit[0] == "residual":
                x[i, edit[1] - s] = self.source.inputs[layer - 1][0, edit[1]]
            elif edit[0] == "head":
                rows = slice(None) if edit[2] is None else slice(edit[2] - s, edit[2] - s + 1)
                cuts["context"].append((at + i, slice(edit[1] * d, (edit[1] + 1) * d), rows))
            else:
                for name in ("q",) if edit[0] == "q" else ("k", "v"):
                    cuts[name].append((at + i, slice(edit[1] * d, (edit[1] + 1) * d), slice(None)))
        return x, cuts

    @contextlib.contextmanager
    def _hooked(self, layer: int, cuts: dict):
        """The layer's W_o input and q, k, v projections with the cut parts taken from the source."""
        attention, s = self.model.attention_module(layer), self.start
        source = {"context": self.source.contexts[layer - 1],
                  **{name: self.source.projections[name][layer - 1] for name in "qkv"}}

        def taking(name, value):
            value = value.clone()
            for i, cols, rows in cuts[name]:
                value[i, rows, cols] = source[name][0, s:][rows, cols]
            return value

        hooks = [attention.W_o.register_forward_pre_hook(lambda _, args: (taking("context", args[0]),))
                 ] if cuts.get("context") else []
        hooks += [getattr(attention, f"W_{name}").register_forward_hook(
            lambda _, __, out, name=name: taking(name, out)) for name in "qkv" if cuts.get(name)]
        try:
            yield
        finally:
            for hook in hooks:
                hook.remove()


def _expanded(cache, n: int):
    """A fresh cache holding `cache`'s keys and values once for each of n copies."""
    from mha_trace.core.attention import KVCache

    fresh = KVCache()
    fresh.k, fresh.v = cache.k.expand(n, -1, -1, -1), cache.v.expand(n, -1, -1, -1)
    return fresh
