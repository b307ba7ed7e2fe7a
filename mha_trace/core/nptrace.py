"""Trace a NumPy implementation: every array operation with its shape, strides and view or copy.

The arrays handed to forward are a thin ndarray subclass that records what is done with them:
ufuncs and operators (`@`, `/`, `np.exp`) through `__array_ufunc__`, functions (`np.max`,
`np.hstack`, `np.sum`) through `__array_function__`, and indexing, `.T`, `.reshape`,
`.transpose`, `.swapaxes` and `.copy` directly. Results stay
recorded arrays, so the whole computation is followed. The steps are the same records as torch's.

Limits: only arrays derived from forward's inputs are seen (an array made from scratch with
`np.zeros` and filled in a loop shows where it meets a traced one); Python-level loops show each
pass (the chapter's per-head loop gives one row per head; the table shows a repeated block once); view or copy is told by
`np.shares_memory` with the inputs, as NumPy itself would answer it.
"""

import os
import sys

import numpy as np

from mha_trace.core.tracer import (ForwardFailed, Step, Trace, _own_part, called_from, leaves,
                                   source_file, where)

_NUMPY_DIR = os.path.dirname(np.__file__)
_THIS_FILE = __file__


class _Recorded(np.ndarray):
    """An ndarray whose operations are written down by the active recorder."""

    recorder: dict | None = None

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        result = getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs))
        return _record(ufunc.__name__, inputs, result)

    def __array_function__(self, func, types, args, kwargs):
        result = func(*_plain(args), **_plain(kwargs))
        return _record(func.__name__, (args, kwargs), result)

    def __getitem__(self, key):
        return _record("index", (self,), np.ndarray.__getitem__(self.view(np.ndarray), _plain(key)))

    @property
    def T(self):
        return _record("transpose", (self,), self.view(np.ndarray).T)

    # the reshapes a head split and merge use (methods, which NumPy does not dispatch)
    def reshape(self, *shape, **kwargs):
        return _record("reshape", (self,), self.view(np.ndarray).reshape(*shape, **kwargs))

    def transpose(self, *axes):
        return _record("transpose", (self,), self.view(np.ndarray).transpose(*axes))

    def swapaxes(self, a, b):
        return _record("swapaxes", (self,), self.view(np.ndarray).swapaxes(a, b))

    def copy(self, order="C"):
        return _record("copy", (self,), self.view(np.ndarray).copy(order))


def _plain(obj):
    """The same arguments with recorded arrays as plain ndarrays (lists, tuples, dicts too)."""
    if isinstance(obj, _Recorded):
        return obj.view(np.ndarray)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_plain(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    return obj


def _arrays(obj) -> list:
    return leaves(obj, np.ndarray)


def _record(op: str, inputs, result):
    recorder = _Recorded.recorder
    if recorder is None or not isinstance(result, np.ndarray):
        return result
    ins = _arrays(inputs)
    file, line, source, span = where(recorder["watch"], sys._getframe(2),
                                     (_THIS_FILE, _NUMPY_DIR))
    earlier = [s.span for s in recorder["steps"] if s.file == file and s.line == line]
    is_view = any(np.shares_memory(result, i) for i in ins)
    item = result.itemsize or 1
    recorder["steps"].append(Step(
        index=len(recorder["steps"]), op=op, text=_own_part(span, earlier), file=file, line=line,
        source=source, shape=tuple(result.shape), stride=tuple(s // item for s in result.strides),
        contiguous=bool(result.flags.c_contiguous), is_view=is_view, dtype=str(result.dtype),
        device="cpu", bytes=0 if is_view else result.nbytes, itemsize=item,
        inputs=[tuple(i.shape) for i in ins], span=span,
        value=_as_tensor(result) if recorder["keep_values"] else None,
        called_from=called_from(recorder["watch"], sys._getframe(2), line)
        if recorder["keep_values"] else ()))
    return result.view(_Recorded)


def _as_tensor(a: np.ndarray):
    import torch

    return torch.from_numpy(np.array(a, dtype=np.float64 if a.dtype.kind == "f" else a.dtype))


def trace(module, *args, watch=(), keep_values=False, **kwargs) -> Trace:
    """Run module.forward(*args, **kwargs) with recorded arrays; the same Trace the torch one gives."""
    import inspect

    own = source_file(module)
    recorder = {"watch": {f for f in (own, *watch) if f}, "steps": [], "keep_values": keep_values}
    names = list(inspect.signature(module.forward).parameters)
    wrapped = []
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            recorder["steps"].append(Step(
                index=len(recorder["steps"]), op="input", text=names[i] if i < len(names) else f"arg{i}",
                file=own or "?", line=0, source="", shape=a.shape,
                stride=tuple(s // a.itemsize for s in a.strides), contiguous=bool(a.flags.c_contiguous),
                is_view=False, dtype=str(a.dtype), device="cpu", bytes=a.nbytes, itemsize=a.itemsize,
                value=_as_tensor(a) if keep_values else None))
            wrapped.append(a.view(_Recorded))
        else:
            wrapped.append(a)
    _Recorded.recorder = recorder
    try:
        output = module.forward(*wrapped, **kwargs)
    except Exception as exc:
        from mha_trace.core.tracer import _failure_of

        raise ForwardFailed(Trace(recorder["steps"], None, _failure_of(exc, own))) from exc
    finally:
        _Recorded.recorder = None
    return Trace(recorder["steps"], _plain(output))


def is_numpy_module(module) -> bool:
    """A class with a forward that is not a torch module: the chapter's NumPy implementation."""
    import torch.nn as nn

    return not isinstance(module, nn.Module) and callable(getattr(module, "forward", None))
