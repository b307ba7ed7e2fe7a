"""What a user's code may change for the whole process, held while it runs and put back after:
torch's namespaces (a module that sets torch.softmax = ...), its default dtype, the working folder
and the signal handlers."""

import contextlib
import os
import types

import torch
import torch.nn as nn

_patches: dict = {}  # what the user's code set on torch: (owner, name) -> value, applied only in it


def forget_patches() -> None:
    """A new module: none of another module's patches."""
    _patches.clear()


def _torch_state() -> dict:
    """torch's namespaces as they stand (owner -> a copy of its attributes): what a user's
    module may patch (torch.softmax = ...)."""
    import torch.nn.functional as F

    return {owner: dict(vars(owner)) for owner in (torch, F, torch.Tensor, nn.Module)}


def _changed(before: dict, after: dict):
    """(owner, name, value) for each attribute the user's code set (a submodule imported meanwhile
    is not a patch)."""
    for owner, names in after.items():
        try:
            if names == before[owner]:  # compared in C, each value by identity first
                continue
        except Exception:  # a value whose == misbehaves: compared one by one below
            pass
        for name, value in names.items():
            if before[owner].get(name, _patches) is not value and not isinstance(value, types.ModuleType):
                yield owner, name, value


@contextlib.contextmanager
def own_torch():
    """The user's patches to torch hold while their code runs and are undone after, so the
    references verify computes use torch's own functions, captured before any user code."""
    before = _torch_state()
    for (owner, name), value in _patches.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in list(_changed(before, _torch_state())):
            _patches[owner, name] = value
            if name in before[owner]:
                setattr(owner, name, before[owner][name])
            else:
                delattr(owner, name)


@contextlib.contextmanager
def own_process():
    """What user code may change for the whole process, put back after it: torch's default dtype,
    the working folder, and (from the main thread) the Ctrl-C and SIGTERM handlers: the command
    line's own, or an API caller's."""
    import signal
    import threading

    dtype, folder = torch.get_default_dtype(), os.getcwd()
    main = threading.current_thread() is threading.main_thread()
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
        with contextlib.suppress(OSError):
            if os.getcwd() != folder:
                os.chdir(folder)
        for s, handler in handlers.items():
            if handler is not None and signal.getsignal(s) is not handler:
                signal.signal(s, handler)
