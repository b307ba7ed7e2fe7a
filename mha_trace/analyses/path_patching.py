"""Path patching (`mha-trace patch --sender L.H --receiver L.H`, Wang et al. 2022): one head's
output difference reaches a later head only through that head's queries, keys or values."""

from dataclasses import dataclass

import numpy as np

from mha_trace.analyses.patch_inputs import (Metric, capture, check_metric, check_patchable, hooked,
                                             texts_of)
from mha_trace.analyses.patching import Patching, share
from mha_trace.errors import MhaError
from mha_trace.models.base import Decoder, ModelCard
from mha_trace.records import Shows
from mha_trace.speedups import batch_work
from mha_trace.core.head import Head, head_names


@dataclass
class PathPatching(Shows):
    """Path patching (Wang et al. 2022): the sender heads' output from the source run (several
    together: their outputs summed) reaches the receiver head only through the receiver's query,
    key or value input; every other path and every other head stays as the target run has it."""

    card: ModelCard
    senders: tuple  # ((layer, head), ...), from 1: patched together
    receiver: tuple
    metric: str
    noising: bool
    clean_value: float
    corrupt_value: float
    via: dict  # "q" | "k" | "v" | "qkv" -> the metric with that input patched

    undefined = Patching.undefined

    def fraction(self, value: float) -> float:
        """The share of the gap (NaN where there is none: see `undefined`)."""
        return float(share(np.array([value]), self.clean_value, self.corrupt_value, self.noising)[0])

    @property
    def sender_names(self) -> str:
        """'1.1' or '1.1 + 1.3'."""
        return " + ".join(head_names(self.senders))


def path_patch(model: Decoder, clean: str, corrupt: str, metric: Metric, senders: list, receiver: tuple,
               noising: bool = False) -> PathPatching:
    """The metric with the senders' output difference (summed) added to the receiver layer's input
    as the receiver's q, k or v reads it (and all three), only the receiver head's output kept."""
    import torch

    from mha_trace.runs.model_options import check_heads

    check_patchable(model)
    senders = list(dict.fromkeys(tuple(s) for s in senders))  # each once
    check_heads(model, senders, "sender")
    check_heads(model, [receiver], "receiver")
    for sender in senders:
        if sender[0] >= receiver[0]:
            raise MhaError(f"the sender {Head(*sender)} must be in an earlier layer than the "
                           f"receiver {Head(*receiver)}: a head reads only what layers "
                           f"before its own wrote", quantity="receiver")
    (clean_ids, _, _), (corrupt_ids, _, _) = texts_of(model, clean, corrupt)
    if len(clean_ids) != len(corrupt_ids):
        raise MhaError(f"the clean and the corrupted text must be the same length in tokens: "
                       f"{len(clean_ids)} and {len(corrupt_ids)}", quantity="corrupt")
    targets = check_metric(metric, clean_ids, corrupt_ids)
    source, target = (corrupt_ids, clean_ids) if noising else (clean_ids, corrupt_ids)
    with model.resident(), batch_work(), torch.no_grad():  # every core for the copies
        source_run, target_run = capture(model, source), capture(model, target)
        source_contexts, source_inputs = source_run.contexts, source_run.inputs
        target_contexts, inputs = target_run.contexts, target_run.inputs
        if metric.kind == "induction":  # the receiver's own induction score, in each run
            runs = {True: source_inputs, False: inputs}
            values = [_through(model, ids, runs[ids is source], 0.0, receiver, "", metric, targets)
                      for ids in (clean_ids, corrupt_ids)]
        else:
            values = [metric(model, model.run(ids)[0], targets)[0] for ids in (clean_ids, corrupt_ids)]
        delta = sum(_head_output(model, s, source_contexts[s[0] - 1])
                    - _head_output(model, s, target_contexts[s[0] - 1]) for s in senders)  # (1, T, D)
        via = {name: float(_through(model, target, inputs, delta, receiver, name, metric, targets))
               for name in ("q", "k", "v", "qkv")}
    return PathPatching(ModelCard.of(model), tuple(senders), tuple(receiver), metric.label, noising,
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
    with hooked(attention.W_o, lambda _, args: captured.append(args[0].clone())):
        _, weights = attention(q, k, v, mask=mask)
    if metric.kind == "induction":
        return induction_score(weights[0, head - 1])
    cols = slice((head - 1) * d, head * d)

    def swap(_, args):
        patched = args[0].clone()
        patched[..., cols] = captured[0][..., cols]
        return (patched,)

    with hooked(attention.W_o, swap):
        hidden, _, _ = model.run(ids, resume=(layer, inputs[layer - 1]))
    return metric(model, hidden, targets)[0]
