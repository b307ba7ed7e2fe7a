"""Activation patching (`mha-trace patch`): run a clean and a corrupted text of the same length,
copy one activation from one run into the other, and measure how much of the metric's gap it
carries. Two grids: the residual stream entering each layer at each position (coarse: where the
information is), and each head's output at every position (which heads carry it). Denoising
copies clean into the corrupted run (the fraction restored); noising copies corrupted into the
clean run (the fraction destroyed). Plain data; the model runs in batches of copies, one copy a
patch, resumed at the patched layer.
"""

import contextlib
from dataclasses import dataclass

import numpy as np

from mha_trace.core.ranks import spearman
from mha_trace.errors import MhaError
from mha_trace.models.base import ModelCard
from mha_trace.models.guards import check_time
from mha_trace.records import Shows


@dataclass(frozen=True)
class Metric:
    """What a run is scored by, from its final hidden states (B, T, D): `logit-diff` is the logit
    of token `a` minus that of `b` at the last position; `loss` the mean next-token loss over the
    positions whose next token the two texts share (`targets`: position -> that token)."""

    kind: str  # "logit-diff" | "loss"
    a: int | None = None
    b: int | None = None
    label: str = ""

    def __call__(self, model, hidden, targets: dict) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        if self.kind == "logit-diff":
            logits = model.logits(hidden)  # (B, V) at the last position
            return (logits[:, self.a] - logits[:, self.b]).double().cpu().numpy()
        at = list(targets)
        logits = torch.stack([model.unembed(hidden[i, at]) for i in range(hidden.size(0))])
        wanted = torch.tensor(list(targets.values()), device=hidden.device)
        nll = F.cross_entropy(logits.flatten(0, 1), wanted.repeat(hidden.size(0)), reduction="none")
        return nll.view(hidden.size(0), len(at)).mean(-1).double().cpu().numpy()


@dataclass
class Patching(Shows):
    renderer = "mha_trace.render.patching"  # how it shows, imported when first shown

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

    @property
    def rank_correlation(self) -> float:
        """Spearman's ρ over the heads between the exact patches and their attribution estimates."""
        return spearman(self.heads, self.attribution)

    def fraction(self, values: np.ndarray) -> np.ndarray:
        """Denoising: the share of the clean − corrupt gap a patch restores; noising: the share
        it destroys. 0 where the gap is 0."""
        gap = self.clean_value - self.corrupt_value
        if gap == 0:
            return np.zeros_like(values)
        base = self.clean_value if self.noising else self.corrupt_value
        return (values - base) / gap * (-1 if self.noising else 1)


def parse_metric(model, text: str) -> Metric:
    """`logit-diff:A,B` (each a single token of the model's) or `loss`."""
    check_patchable(model)
    if text == "loss":
        return Metric("loss", label="the next-token loss on the tokens both texts share")
    if text == "induction":
        return Metric("induction", label="the receiver's induction score (its weight on the token "
                                         "after the query's earlier copy)")
    kind, _, words = text.partition(":")
    pair = [w for w in words.split(",")] if kind == "logit-diff" else []
    if len(pair) != 2 or not all(w.strip() for w in pair):
        raise MhaError(f"metric {text!r} is not 'loss' or 'logit-diff:A,B' (e.g. logit-diff:"
                       f"{' Paris, London' if model.capabilities.text else '3,7'})", quantity="metric")
    ids = []
    for word in pair:
        found = model.tokenize(word)
        if len(found) != 1:
            raise MhaError(f"metric word '{word}' is {len(found)} tokens for {model.name}; a logit "
                           f"difference compares single tokens (a leading space often makes one)",
                           quantity="metric")
        ids.append(found[0])
    return Metric("logit-diff", ids[0], ids[1], f"logit({pair[0].strip()}) − logit({pair[1].strip()})")


def patch(model, clean: str, corrupt: str, metric: Metric, noising: bool = False,
          on_layer=lambda: None) -> Patching:
    """Both grids: every layer's residual input at every position, and every head's output, each
    patched alone from the source run (clean when denoising) into the target run."""
    import torch

    check_patchable(model)
    (clean_ids, clean_tokens, _), (corrupt_ids, corrupt_tokens, _) = _texts(model, clean, corrupt)
    if metric.kind == "induction":
        raise MhaError("metric induction scores one receiving head: give --sender and --receiver "
                       "(path patching)", quantity="metric")
    if len(clean_ids) != len(corrupt_ids):
        raise MhaError(f"the clean and the corrupted text must be the same length in tokens to "
                       f"patch position by position: {len(clean_ids)} and {len(corrupt_ids)}",
                       quantity="corrupt")
    check_time(model, len(clean_ids), patch_copies(model, len(clean_ids)), "patch", "clean")
    targets = {t: clean_ids[t + 1] for t in range(len(clean_ids) - 1)
               if clean_ids[t + 1] == corrupt_ids[t + 1]}  # the next tokens both texts share
    if metric.kind == "loss" and not targets:
        raise MhaError("the loss is taken over the next tokens both texts share, and these share "
                       "none: corrupt fewer tokens, or use logit-diff:A,B", quantity="metric")
    source, target = (corrupt_ids, clean_ids) if noising else (clean_ids, corrupt_ids)
    with model.resident(), torch.no_grad():
        clean_hidden, _, _ = model.run(clean_ids)
        corrupt_hidden, _, _ = model.run(corrupt_ids)
        values = [metric(model, h, targets)[0] for h in (clean_hidden, corrupt_hidden)]
        contexts, source_inputs = _contexts(model, source)  # what the patches copy
        _, target_inputs, _ = model.run(target)
        attribution = _attribution(model, target, contexts, metric, targets, values[0 if noising else 1])
        residual, heads = [], []
        for layer in range(1, model.layers + 1):
            row = _layer_row(model, target, target_inputs[layer - 1], source_inputs[layer - 1],
                             contexts[layer - 1], layer, metric, targets)
            residual.append(row[:len(target)])
            heads.append(row[len(target):])
            on_layer()
    card = ModelCard.of(model)
    return Patching(card, tuple(clean_tokens), tuple(corrupt_tokens), metric.label, noising,
                    float(values[0]), float(values[1]), np.array(residual), np.array(heads),
                    attribution)


BATCHED = 0.4  # a batch of copies costs about this share of running them one by one (2 cores)


def patch_copies(model, tokens: int) -> int:
    """Whole passes' worth of copies a patch runs: a batch of (tokens + heads) copies a layer,
    each from its layer to the last (half the layers on average), at the batched rate."""
    return round(BATCHED * (model.layers + 1) / 2 * (tokens + model.heads))


def _texts(model, clean: str, corrupt: str) -> tuple:
    """Each text's (ids, tokens, words), a problem with one named by its own option."""
    found = []
    for name, text in (("clean", clean), ("corrupt", corrupt)):
        if not isinstance(text, str) or not text.strip():
            raise MhaError(f"{name} text is empty: give a text to run", quantity=name)
        try:
            found.append(model.pieces(text))
        except MhaError as e:
            raise MhaError(e.message.removeprefix("sentence "), e.exit_code, quantity=name) from None
    return found


def check_patchable(model) -> None:
    if not model.capabilities.causal:
        raise MhaError(f"patch scores a causal model's next token; {model.name} is an encoder "
                       f"(try --model smollm2 or --checkpoint run.pt)", quantity="model")


def default_pair(model, path: bool = False) -> tuple[str, str, str]:
    """(clean, corrupt, metric) when none is given: for a trained run its probe and the probe with
    its first half's tokens re-drawn (what the repeat copies is gone), scored by the loss (`path`
    patching: by the receiver's induction score); for a language model an indirect-object
    sentence and the same with the subject named the other name (Wang et al. 2022), scored by the
    logit difference of the two names."""
    if model.capabilities.trained_run:
        import torch

        ids = [int(t) for t in model.default_text.split()]
        half = len(ids) // 2
        g = torch.Generator().manual_seed(1)
        fresh = torch.randint(0, model.vocab_size, (half,), generator=g).tolist()
        return model.default_text, " ".join(map(str, fresh + ids[half:])), "induction" if path else "loss"
    return ("When Mary and John went to the store, John gave a drink to",
            "When Mary and John went to the store, Mary gave a drink to", "logit-diff: Mary, John")


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
            _metric_tensor(model, metric, hidden, targets).backward()
    finally:
        for hook in hooks:
            hook.remove()
    rows = []
    for layer, (probe, context) in enumerate(probes, 1):
        attention = model.attention_module(layer)
        change = ((source_contexts[layer - 1] - context) * probe.grad)[0].sum(0)  # (H·d_k,)
        rows.append(base + change.view(attention.heads, attention.d_k).sum(-1).double().cpu().numpy())
    return np.array(rows)


def _metric_tensor(model, metric, hidden, targets):
    """The metric of one run as a tensor, for its gradient."""
    import torch
    import torch.nn.functional as F

    if metric.kind == "logit-diff":
        logits = model.logits(hidden)
        return logits[0, metric.a] - logits[0, metric.b]
    logits = model.unembed(hidden[0, list(targets)])
    return F.cross_entropy(logits, torch.tensor(list(targets.values()), device=hidden.device))


def _contexts(model, ids) -> tuple[list, list]:
    """Each layer's attention context (the W_o input, (1, T, H·d_k)) and input, for one run."""
    found = []
    hooks = [model.attention_module(layer).W_o.register_forward_pre_hook(
        lambda _, args: found.append(args[0].clone())) for layer in range(1, model.layers + 1)]
    try:
        _, inputs, _ = model.run(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return found, inputs


def _layer_row(model, ids, x, source_x, context, layer: int, metric, targets) -> np.ndarray:
    """One batch of copies of the target run, resumed at `layer`: copy t (one a position) takes
    the source's residual entry at t; copy T + h (one a head) takes the source's output of head h
    (its slice of the W_o input, every position). The metric of each copy."""
    attention = model.attention_module(layer)
    T, H, d = len(ids), attention.heads, attention.d_k
    x = x.expand(T + H, -1, -1).clone()  # (T + H copies, T, D)
    for t in range(T):
        x[t, t] = source_x[0, t]

    def swap(_, args):
        patched = args[0].clone()
        for h in range(H):
            patched[T + h, :, h * d:(h + 1) * d] = context[0, :, h * d:(h + 1) * d]
        return (patched,)

    with _hooked(attention.W_o, swap):
        hidden, _, _ = model.run(ids, batch=T + H, resume=(layer, x))
    return metric(model, hidden, targets)


@contextlib.contextmanager
def _hooked(module, hook):
    handle = module.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()


@dataclass
class PathPatching(Shows):
    """Path patching (Wang et al. 2022): the sender head's output from the source run reaches the
    receiver head only through the receiver's query, key or value input; every other path and
    every other head stays as the target run has it."""

    renderer = "mha_trace.render.patching"

    card: ModelCard
    sender: tuple  # (layer, head), from 1
    receiver: tuple
    metric: str
    noising: bool
    clean_value: float
    corrupt_value: float
    via: dict  # "q" | "k" | "v" | "qkv" -> the metric with that input patched

    def fraction(self, value: float) -> float:
        return float(Patching.fraction(self, np.array([value]))[0])


def path_patch(model, clean: str, corrupt: str, metric: Metric, sender: tuple, receiver: tuple,
               noising: bool = False) -> PathPatching:
    """The metric with the sender's output difference added to the receiver layer's input as the
    receiver's q, k or v reads it (and all three), only the receiver head's output kept from that."""
    import torch

    from mha_trace.analyses.model_analysis import check_heads

    check_patchable(model)
    check_heads(model, [sender, receiver])
    if sender[0] >= receiver[0]:
        raise MhaError(f"the sender {sender[0]}.{sender[1]} must be in an earlier layer than the "
                       f"receiver {receiver[0]}.{receiver[1]}: a head reads only what layers before "
                       f"its own wrote", quantity="receiver")
    (clean_ids, _, _), (corrupt_ids, _, _) = _texts(model, clean, corrupt)
    if len(clean_ids) != len(corrupt_ids):
        raise MhaError(f"the clean and the corrupted text must be the same length in tokens: "
                       f"{len(clean_ids)} and {len(corrupt_ids)}", quantity="corrupt")
    targets = {t: clean_ids[t + 1] for t in range(len(clean_ids) - 1)
               if clean_ids[t + 1] == corrupt_ids[t + 1]}
    source, target = (corrupt_ids, clean_ids) if noising else (clean_ids, corrupt_ids)
    with model.resident(), torch.no_grad():
        source_contexts, source_inputs = _contexts(model, source)
        target_contexts, inputs = _contexts(model, target)
        if metric.kind == "induction":  # the receiver's own induction score, in each run
            runs = {True: source_inputs, False: inputs}
            values = [_through(model, ids, runs[ids is source], 0.0, receiver, "", metric, targets)
                      for ids in (clean_ids, corrupt_ids)]
        else:
            values = [metric(model, model.run(ids)[0], targets)[0] for ids in (clean_ids, corrupt_ids)]
        delta = (_head_output(model, sender, source_contexts[sender[0] - 1])
                 - _head_output(model, sender, target_contexts[sender[0] - 1]))  # (1, T, D)
        via = {name: float(_through(model, target, inputs, delta, receiver, name, metric, targets))
               for name in ("q", "k", "v", "qkv")}
    return PathPatching(ModelCard.of(model), tuple(sender), tuple(receiver), metric.label, noising,
                        float(values[0]), float(values[1]), via)


def induction_score(weights) -> float:
    """A head's mean weight, from each query of a repeated second half, on the key just after the
    query's earlier copy (the probe: T random tokens whose second half repeats the first)."""
    T = weights.size(-1)
    half = T // 2
    return float(sum(weights[t, t - half + 1] for t in range(half, T)) / (T - half))


def _head_output(model, at: tuple, context):
    """One head's share of its layer's output: its slice of the W_o input through its W_o columns."""
    attention = model.attention_module(at[0])
    d = attention.d_k
    cols = slice((at[1] - 1) * d, at[1] * d)
    return context[..., cols] @ attention.W_o.weight[:, cols].T


def _through(model, ids, inputs, delta, receiver: tuple, via: str, metric, targets):
    """The target run with the receiver head's output recomputed from an input that carries the
    sender's difference in q, k or v only (the layer's norm applied to it as the layer applies it)."""
    import torch

    layer, head = receiver
    attention = model.attention_module(layer)
    norm = model.attention_norm_of(layer) or (lambda x: x)
    plain, moved = norm(inputs[layer - 1]), norm(inputs[layer - 1] + delta)
    q, k, v = (moved if name in via else plain for name in "qkv")
    T, d = len(ids), attention.d_k
    mask = torch.ones(T, T, dtype=torch.bool, device=plain.device).tril()
    captured = []
    with _hooked(attention.W_o, lambda _, args: captured.append(args[0].clone())):
        _, weights = attention(q, k, v, mask=mask)
    if metric.kind == "induction":
        return induction_score(weights[0, head - 1])
    cols = slice((head - 1) * d, head * d)

    def swap(_, args):
        patched = args[0].clone()
        patched[..., cols] = captured[0][..., cols]
        return (patched,)

    with _hooked(attention.W_o, swap):
        hidden, _, _ = model.run(ids, resume=(layer, inputs[layer - 1]))
    return metric(model, hidden, targets)[0]
