"""What a user's forward returned: the output and the per-head weights, told apart, as tensors.

A NumPy implementation's arrays (and lists of per-head arrays) become tensors; anything that is
not numbers to compare is one line (exit 1), never a traceback.
"""

import torch

from mha_trace.errors import MhaError


def split_result(result, x: torch.Tensor):
    """(output, weights or None) from a tensor, (output, weights) or (weights, output).

    The output keeps the input's width (d_model); weights end in (T, T), are non-negative and
    their rows sum to 1. When T == d_model the shapes alone cannot tell them apart, so the values
    decide; when even they cannot, the user is asked rather than guessed for.
    """
    result, x = _tensors_of(result), _tensors_of(x)
    if isinstance(result, torch.Tensor):
        _check_values([result], x)
        return result, None
    tensors = [t for t in result if isinstance(t, torch.Tensor)] if isinstance(result, (tuple, list)) else []
    if not tensors:
        raise MhaError(f"forward returned {type(result).__name__}, expected a tensor or a tuple "
                       f"of (output, weights)", exit_code=1)
    _check_values(tensors, x)
    if len(result) > 2:
        raise MhaError(f"forward returned {len(result)} values, expected the output or (output, "
                       f"weights)", exit_code=1)
    T, D = x.shape[-2], x.shape[-1]
    outputs = [t for t in tensors if t.dim() >= 2 and t.shape[-1] == D and t.shape[-2] == T]
    if len(outputs) > 1:
        not_weights = [t for t in outputs if not _rows_sum_to_one(t)]
        if len(not_weights) == 1:
            outputs = not_weights
        else:
            shapes = " and ".join(str(list(t.shape)) for t in outputs)
            raise MhaError(f"forward returned {shapes}: with seq = d_model = {D} neither shape nor "
                           f"values tell the output from the weights (return (output, weights) "
                           f"with different seq and d_model, e.g. --seq {T + 1})", exit_code=1)
    output = outputs[0] if outputs else tensors[0]
    rest = [t for t in tensors if t is not output]
    return output, (rest[0] if rest else None)


def _check_values(tensors: list, x: torch.Tensor) -> None:
    """Numbers to compare: a tensor on the meta device holds none (unless the input was meta)."""
    if x.device.type != "meta" and any(t.device.type == "meta" for t in tensors):
        raise MhaError("forward returned a tensor on the meta device, which holds no values "
                       "(make new tensors on x.device)", exit_code=1)


def _tensors_of(obj):
    """A NumPy implementation's results as tensors: arrays, and a list of per-head arrays stacked."""
    import numpy as np

    if isinstance(obj, list) and obj and all(isinstance(a, np.ndarray) for a in obj):
        if len({a.shape for a in obj}) > 1:
            raise MhaError(f"forward returned per-head arrays of different shapes "
                           f"({', '.join(str(list(a.shape)) for a in obj)})", exit_code=1)
        obj = np.stack(obj)
    if isinstance(obj, np.ndarray):
        if not (np.issubdtype(obj.dtype, np.number) or obj.dtype == bool):
            kind = {"O": "Python objects", "U": "text", "S": "bytes"}.get(obj.dtype.kind,
                                                                         obj.dtype.name)
            raise MhaError(f"forward returned an array of {kind}, expected numbers", exit_code=1)
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, tuple):
        return tuple(_tensors_of(o) for o in obj)
    return obj


def _rows_sum_to_one(t: torch.Tensor) -> bool:
    if t.device.type == "meta" or not t.is_floating_point():
        return False
    t = t.detach().double()
    return bool((t >= 0).all() and torch.allclose(t.sum(-1), torch.ones((), dtype=t.dtype), atol=1e-3))
