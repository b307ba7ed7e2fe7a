"""What a user's code may change for the whole process, held while it runs and put back after:
torch's namespaces (a module that sets torch.softmax = ...), its default dtype, the working folder,
the signal handlers; and the warnings it raises, each said once in one line naming its line."""

import contextlib
import os
import re
import sys
import sysconfig
import types

import numpy as np
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


_TRIGGERED = re.compile(r"\s*\(Triggered internally at [^)]*\)\.?\s*$")  # torch's C++ source line
_LIBRARIES = tuple(folder + os.sep for folder in (  # torch's, NumPy's, the tool's, Python's
    os.path.dirname(torch.__file__), os.path.dirname(np.__file__),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), sysconfig.get_paths()["stdlib"]))


@contextlib.contextmanager
def said_warnings(what: str):
    """The warnings raised while the user's code runs (its own, or torch's about a call of its),
    each said once on stderr in one line at the user's line that led to it: "forward warned at
    x.py:32: UserWarning: ...", never a Python warning pointing into the tool."""
    import warnings

    said: dict = {}

    def show(message, category, filename, lineno, file=None, line=None):
        frame = sys._getframe(1)
        while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_LIBRARIES):
            frame = frame.f_back
        if frame is not None:
            filename, lineno = frame.f_code.co_filename, frame.f_lineno
        said.setdefault((filename, lineno, category.__name__, _TRIGGERED.sub("", str(message))), None)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show
        try:
            yield
        finally:
            from mha_trace.errors import printable
            from mha_trace.io.output import display_path

            for filename, lineno, kind, message in said:
                sys.stderr.write(printable(f"{what} warned at {display_path(filename)}:{lineno}: "
                                           f"{kind}: {' '.join(message.split())}") + "\n")
