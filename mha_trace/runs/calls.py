"""A run of the Python API's `trace(module, *args, **kwargs)`: the module (or function) and its
arguments exactly as given, the sizes read off them."""

import inspect

import numpy as np
import torch

from mha_trace.core.tracer import source_file
from mha_trace.runs.run import Run, Sizes
from mha_trace.runs.usermodule import HEADS_NAMES


def from_call(module, args: tuple, kwargs: dict) -> Run:
    """The Run of `module(*args, **kwargs)` as given (a function too): sizes read off the first
    array argument, (batch, seq, d_model) or one head's (batch, heads, seq, d_k), and the
    module's head count where it says one; the call named with forward's own parameters."""
    first = next((a for a in args if isinstance(a, (torch.Tensor, np.ndarray))), None)
    dims = (1, *first.shape) if first is not None and first.ndim == 2 else \
        tuple(first.shape) if first is not None else ()
    heads = next((getattr(module, n) for n in HEADS_NAMES
                  if isinstance(getattr(module, n, None), int)), 1)
    if len(dims) == 4:  # per-head tensors, as an attention function takes them
        dims, heads = (dims[0], dims[2], dims[1] * dims[3]), dims[1]
    batch, seq, width = dims if len(dims) == 3 else (1, 1, 1)
    sizes = Sizes(batch, seq, width, heads=heads,
                  dtype="float32" if first is None else str(first.dtype).removeprefix("torch."),
                  device=getattr(getattr(first, "device", None), "type", "cpu"))
    function = None if hasattr(module, "forward") else getattr(module, "__name__", None)
    return Run(module, args, kwargs, sizes, label=function or type(module).__name__,
               call=f"{function or 'forward'}({_arguments(module, args, kwargs)})",
               source=source_file(module) or "?")


def _arguments(module, args: tuple, kwargs: dict) -> str:
    """The names the call's arguments take in forward (or the function): "query, key, value";
    "x" for one it cannot name."""
    try:
        bound = inspect.signature(getattr(module, "forward", module)).bind(*args, **kwargs)
    except (TypeError, ValueError):  # not its arguments, or a builtin without a signature
        return ", ".join(["x"] * len(args) + list(kwargs))
    kinds = {n: p.kind for n, p in bound.signature.parameters.items()}
    return ", ".join(n if kinds[n] != inspect.Parameter.VAR_POSITIONAL else ", ".join(["x"] * len(v))
                     for n, v in bound.arguments.items())
