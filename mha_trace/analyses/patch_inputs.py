"""What every kind of patching shares: the metric a run is scored by, the two texts and their
default pair, and one run's activations captured layer by layer (`mha-trace patch`)."""

import contextlib
from typing import TYPE_CHECKING
from dataclasses import dataclass

import numpy as np

if TYPE_CHECKING:
    import torch

from mha_trace.errors import MhaError


LOGIT_ROWS = 512  # positions unembedded at once for the loss (SmolLM2: 100 MB of logits)


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
            logits = model.unembed(hidden[:, -1], ids=(self.a, self.b))  # (B, 2) at the last position
            return (logits[:, 0] - logits[:, 1]).double().cpu().numpy()
        at, B = list(targets), hidden.size(0)
        wanted = torch.tensor(list(targets.values()), device=hidden.device)
        step = max(1, LOGIT_ROWS // len(at))  # copies a pass through the unembedding
        nll = torch.cat([F.cross_entropy(model.unembed(hidden[i:i + step, at].flatten(0, 1)),
                                         wanted.repeat(min(step, B - i)), reduction="none")
                         for i in range(0, B, step)])
        return nll.view(B, len(at)).mean(-1).double().cpu().numpy()


def parse_metric(model, text: str) -> Metric:
    """`logit-diff:A,B` (each a single token of the model's) or `loss`."""
    check_patchable(model)
    if text == "loss":
        return Metric("loss", label="the next-token loss on the tokens both texts share")
    if text == "induction":
        return Metric("induction", label="the receiver's induction score (its weight on the token "
                                         "after the query's earlier copy)")
    kind, _, words = text.partition(":") if isinstance(text, str) else ("", "", "")
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


def shared_targets(clean_ids, corrupt_ids) -> dict:
    """position -> the next token, where both texts have the same next token."""
    return {t: clean_ids[t + 1] for t in range(len(clean_ids) - 1)
            if clean_ids[t + 1] == corrupt_ids[t + 1]}


def texts_of(model, clean: str, corrupt: str) -> list:
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


INDUCTION_LEAST = 4  # tokens: a first half of two and its repeat (an earlier copy with a token after it)


def check_metric(metric: Metric, clean_ids: list, corrupt_ids: list) -> dict:
    """The metric scores these texts, or one line says why not; the shared next tokens (the loss's
    targets). Judged on the token ids, before a patch runs."""
    targets = shared_targets(clean_ids, corrupt_ids)
    if metric.kind == "loss" and not targets:
        raise MhaError("the loss is taken over the next tokens both texts share, and these share "
                       "none: corrupt fewer tokens, or use logit-diff:A,B", quantity="metric")
    if metric.kind == "induction" and len(clean_ids) < INDUCTION_LEAST:
        raise MhaError(f"induction scores a text whose second half repeats its first: it needs at "
                       f"least {INDUCTION_LEAST} tokens, and the texts have {len(clean_ids)}",
                       quantity="metric")
    return targets


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


def metric_tensor(model, metric, hidden, targets):
    """The metric of one run as a tensor, for its gradient."""
    import torch
    import torch.nn.functional as F

    if metric.kind == "logit-diff":
        logits = model.unembed(hidden[:, -1], ids=(metric.a, metric.b))
        return logits[0, 0] - logits[0, 1]
    logits = model.unembed(hidden[0, list(targets)])
    return F.cross_entropy(logits, torch.tensor(list(targets.values()), device=hidden.device))


@dataclass
class Run:
    """One run's activations, each a list over the layers of (1, T, ·): the layer's input (the
    residual stream), its W_o input (the heads' outputs side by side) and its q, k, v
    projections (before RoPE); and the final hidden states."""

    inputs: list
    contexts: list
    projections: dict  # "q" | "k" | "v" -> one tensor a layer
    hidden: "torch.Tensor"


def capture(model, ids) -> Run:
    found: dict[str, list] = {name: [] for name in ("context", "q", "k", "v")}
    hooks = []
    for layer in range(1, model.layers + 1):
        attention = model.attention_module(layer)
        hooks.append(attention.W_o.register_forward_pre_hook(
            lambda _, args: found["context"].append(args[0].clone())))
        for name in "qkv":
            hooks.append(getattr(attention, f"W_{name}").register_forward_hook(
                lambda _, __, out, name=name: found[name].append(out.clone())))
    try:
        hidden, inputs, _ = model.run(ids)
    finally:
        for hook in hooks:
            hook.remove()
    return Run(inputs, found["context"], {name: found[name] for name in "qkv"}, hidden)


@contextlib.contextmanager
def hooked(module, hook):
    handle = module.register_forward_pre_hook(hook)
    try:
        yield
    finally:
        handle.remove()
