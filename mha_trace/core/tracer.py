"""Watch a module's forward pass from outside and record every tensor operation.

The tracer is a TorchFunctionMode: every torch function, Tensor method and operator called while it
is active passes through `__torch_function__`, where we run it and write down what came out. It
never touches the module: no hooks, no change of device or train/eval mode, and it always detaches.

>>> steps = trace(MultiHeadAttention(512, 8), torch.randn(2, 10, 512)).steps
>>> [s.shape for s in steps[:4]]
[(2, 10, 512), (2, 10, 512), (2, 10, 8, 64), (2, 8, 10, 64)]
"""

import functools
from typing import Any
import inspect
import linecache
import os
import sys
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

_TORCH_DIR = os.path.dirname(torch.__file__)
_PACKAGE_DIR = os.path.dirname(os.path.dirname(__file__)) + os.sep  # ours: never a row's line

# operator dunders and their everyday names
_OP_NAMES = {"truediv": "div", "rtruediv": "div", "mul": "mul", "rmul": "mul", "add": "add",
             "radd": "add", "sub": "sub", "rsub": "sub", "matmul": "matmul", "rmatmul": "matmul",
             "getitem": "index", "invert": "not", "eq": "eq", "ne": "ne", "pow": "pow",
             "neg": "neg", "and": "and", "or": "or", "lt": "lt", "gt": "gt", "le": "le", "ge": "ge"}


@dataclass
class Step:
    """One tensor operation of the forward pass, as it ran."""

    index: int
    op: str  # "linear", "view", "transpose", ... or "input"
    text: str  # the sub-expression that ran, e.g. ".transpose(1, 2)"
    file: str
    line: int
    source: str  # the whole source line, stripped
    shape: tuple
    stride: tuple
    contiguous: bool
    is_view: bool  # shares storage with one of its inputs
    dtype: str
    device: str
    bytes: int  # newly allocated bytes; 0 for views
    itemsize: int  # bytes per element
    inputs: list = field(default_factory=list)  # shapes of the tensor inputs
    span: str = ""  # the whole expression that this call ends, for prefix stripping
    phase: str = ""  # which call of forward: "" for one pass, "prefill" / "decode step 1" ...
    value: object = None  # a copy of the output, when the trace keeps values (checking a module)
    called_from: tuple = ()  # (line, source) in forward when `line` is in a helper it called
    from_input: bool = True  # computed from forward's inputs (False: from constants and weights alone)
    parents: tuple = ()  # the indices of the steps whose outputs it took in (kept values only)


@dataclass
class Failure:
    """The operation that raised inside the forward pass."""

    op: str
    text: str
    file: str
    line: int
    source: str
    inputs: list
    message: str

    @property
    def hint(self) -> str:
        """How the usual cause of this failure is fixed, or "" when it is not a usual one."""
        if self.op == "view" and "contiguous" in self.message:
            return ("the input to .view() is not contiguous (a transpose made it so); call "
                    ".contiguous() first, or use .reshape()")
        if "not enough values to unpack (expected 4, got 3)" in self.message:
            return ("it reads four axes from its input, an image's (B, H, W, C) grid perhaps; verify "
                    "feeds attention a sequence, (B, T, d_model)")
        if self.op in ("matmul", "linear", "mm", "bmm") and "shapes cannot be multiplied" in self.message:
            return "the inner dimensions differ; check the last dim of the left and the rows of the right"
        return ""


@dataclass
class Trace:
    steps: list
    output: Any = None
    failure: Failure | None = None


class ForwardFailed(Exception):
    """The module's forward raised; carries the trace up to the failure."""

    def __init__(self, trace: Trace):
        super().__init__(trace.failure.message if trace.failure else "forward failed")
        self.trace = trace


def _message(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else f"{type(exc).__name__} (no message)"


def _failure_of(exc: BaseException, own_file: str | None) -> Failure:
    """An exception raised by Python code in forward (not a torch op): its own line."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if f.filename == own_file] or frames[-1:]
    where = mine[-1] if mine else None
    return Failure(type(exc).__name__, "", where.filename if where else own_file or "?",
                   where.lineno if where else 0, (where.line or "") if where else "", [],
                   f"{type(exc).__name__}: {_message(exc)}" if str(exc).strip() else _message(exc))


def leaves(obj, kind) -> list:
    """The objects of `kind` in an argument tree of lists, tuples and dicts."""
    if isinstance(obj, kind):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in leaves(o, kind)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in leaves(o, kind)]
    return []


def _tensors(obj):
    return leaves(obj, torch.Tensor)


def _op_name(func) -> str:
    name = getattr(func, "__name__", str(func))
    if name == "__get__":  # a property such as Tensor.T
        return getattr(getattr(func, "__self__", None), "__name__", "attribute")
    if name.startswith("__") and name.endswith("__"):
        name = name.strip("_")
        return _OP_NAMES.get(name, name)
    return name


def _storage_id(t: torch.Tensor):
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):  # tensors without storage (e.g. some subclasses)
        return None


def _matching_paren(text: str) -> int:
    """Index of the '(' that matches the final ')' of text, or -1."""
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == ")":
            depth += 1
        elif text[i] == "(":
            depth -= 1
            if depth == 0:
                return i
    return -1


def _own_part(span: str, earlier: list) -> str:
    """The part of `span` this call added: `.view(...)` of `self.W_q(q).view(...)`.

    An earlier step on the same line whose expression is a prefix of ours is our receiver (or left
    operand); we show what comes after it.
    """
    for prev in reversed(earlier):
        if prev and len(prev) < len(span) and span.startswith(prev):
            rest = span[len(prev):].strip()
            return rest if rest.startswith(".") else "… " + rest
    return span


def where(watch: set, frame, library: tuple):
    """(file, line, source line, expression span) of the innermost frame in a watched file, else
    of the innermost frame outside the library (files or folders in `library`)."""
    fallback = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename in watch:
            break
        if fallback is None and not filename.startswith(library):
            fallback = frame
        frame = frame.f_back
    frame = frame or fallback
    if frame is None:
        return "?", 0, "", ""
    code = frame.f_code
    lineno, end_lineno, col, end_col = _positions(code)[frame.f_lasti // 2]
    lineno = lineno or frame.f_lineno
    line = linecache.getline(code.co_filename, lineno).rstrip("\n")
    if col is None or end_col is None:
        span = line.strip()
    elif end_lineno == lineno:
        span = line[col:end_col]
    else:
        span = line[col:].rstrip() + " …"
    return code.co_filename, lineno, line.strip(), span


@functools.lru_cache(maxsize=256)
def _positions(code) -> tuple:
    """Each instruction's (line, end line, column, end column) in a code object: read once a
    function, not once an op."""
    return tuple(code.co_positions())


def source_file(obj) -> str | None:
    """The file of the code a module (or a function) runs, for the tracer to watch: its class's
    file; for a class defined in a notebook's cell or `python -c`, whose module has no file, the
    file its own methods' code names (IPython keeps each cell's lines under that name)."""
    code = getattr(obj, "__code__", None)
    if code is not None:  # a function or a lambda
        return code.co_filename
    cls = obj if isinstance(obj, type) else type(obj)
    try:
        return inspect.getsourcefile(cls)
    except (TypeError, OSError):
        pass
    for value in vars(cls).values():
        code = getattr(getattr(value, "__func__", value), "__code__", None)
        if code is not None:
            return code.co_filename
    return None


def called_from(watch: set, frame, line: int) -> tuple:
    """(line, source line) of the outermost frame in a watched file (forward itself) when it is
    not `line`: the call into a helper of the user's that ran the op; else ()."""
    outer = None
    while frame is not None:
        if frame.f_code.co_filename in watch:
            outer = frame
        frame = frame.f_back
    if outer is None or outer.f_lineno == line:
        return ()
    return outer.f_lineno, linecache.getline(outer.f_code.co_filename, outer.f_lineno).strip()


class _Recorder(TorchFunctionMode):
    def __init__(self, watch: set, keep_values: bool = False):
        super().__init__()
        self.watch = watch
        self.keep_values = keep_values
        self.steps: list[Step] = []
        self.failure: Failure | None = None
        self.from_input: dict = {}  # id -> tensor, for what forward's inputs reach (kept alive)
        self.made: dict = {}  # id of such a tensor -> the index of the step that made it
        self.spans: dict = {}  # (file, line) -> the expressions of its steps so far

    def _where(self):
        """(file, line, source line, expression span) of the innermost watched frame."""
        return where(self.watch, sys._getframe(2), (_PACKAGE_DIR, _TORCH_DIR))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.compiler.is_compiling() or torch.jit.is_tracing():  # traced for a graph
            return func(*args, **kwargs)  # (flex_attention, torch.compile, torch.jit.trace)
        inputs = _tensors(args) + _tensors(kwargs)
        try:
            result = func(*args, **kwargs)
        except Exception as exc:
            file, line, source, span = self._where()
            earlier = self.spans.get((file, line), [])
            self.failure = Failure(_op_name(func), _own_part(span, earlier), file, line, source,
                                   [tuple(t.shape) for t in inputs], _message(exc))
            raise
        outputs = _tensors(result) if isinstance(result, (torch.Tensor, tuple, list)) else []
        if outputs:
            file, line, source, span = self._where()
            earlier = self.spans.get((file, line), [])
            self._record(_op_name(func), _own_part(span, earlier), file, line, source, span,
                         outputs, inputs)
            if self.keep_values and self.watch:
                self.steps[-1].called_from = called_from(self.watch, sys._getframe(1), line)
            if self.keep_values:  # which steps the inputs reach: the rest is constants (ALiBi's)
                reached = any(id(t) in self.from_input for t in inputs)
                self.steps[-1].from_input = reached
                self.steps[-1].parents = tuple(sorted({self.made[id(t)] for t in inputs if id(t) in self.made}))
                self.from_input |= {id(t): t for t in outputs} if reached else {}
                self.made |= {id(t): len(self.steps) - 1 for t in outputs} if reached else {}
        return result

    def _record(self, op, text, file, line, source, span, outputs, inputs):
        self.spans.setdefault((file, line), []).append(span)
        in_storages = {_storage_id(t) for t in inputs}
        out = outputs[0]
        new_bytes = sum(t.numel() * t.element_size() for t in outputs
                        if _storage_id(t) not in in_storages)
        self.steps.append(Step(
            index=len(self.steps), op=op, text=text, file=file, line=line, source=source,
            shape=tuple(out.shape), stride=tuple(out.stride()), contiguous=out.is_contiguous(),
            is_view=_storage_id(out) in in_storages, dtype=str(out.dtype).removeprefix("torch."),
            device=out.device.type, bytes=new_bytes, itemsize=out.element_size(), inputs=[tuple(t.shape) for t in inputs],
            span=span, value=out.detach().clone() if self.keep_values and out.device.type != "meta" else None))


def _input_steps(module, args, kwargs, recorder, phase=""):
    """One "input" row per distinct tensor handed to forward, named by forward's parameters."""
    try:
        bound = inspect.signature(getattr(module, "forward", module)).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):  # not its arguments, or a builtin without a signature
        bound = {f"arg{i}": a for i, a in enumerate(args)} | kwargs
    seen = set()
    for name, value in bound.items():
        if isinstance(value, torch.Tensor) and id(value) not in seen:
            seen.add(id(value))
            where = source_file(module) or "?"
            recorder._record("input", name, where, 0, "", "", [value], [])
            recorder.steps[-1].is_view = False
            # what the tensor holds in memory: an expanded (T, T) mask stores one row of T
            recorder.steps[-1].bytes = min(value.numel() * value.element_size(),
                                           value.untyped_storage().nbytes())
            recorder.steps[-1].phase = phase
            recorder.from_input[id(value)] = value
            recorder.made[id(value)] = len(recorder.steps) - 1


def trace(module, *args, watch=(), keep_values=False, **kwargs) -> Trace:
    """Run module(*args, **kwargs) once and return the recorded steps and its output.

    watch: extra source files whose lines the rows are attributed to (the module's own file is
    always watched). keep_values: each step also keeps a copy of its output (small runs only).
    Raises ForwardFailed, carrying the steps so far, when forward raises.
    """
    return trace_phases(module, [("", args, kwargs)], watch, keep_values)


def trace_phases(module, phases, watch=(), keep_values=False) -> Trace:
    """Run forward once per phase, in order, under one recorder: [(label, args, kwargs), ...].

    Decoding is a prefill call and then one call per new token; every step carries its phase.
    The output is the last call's.
    """
    own_file = source_file(module)
    recorder = _Recorder({f for f in (own_file, *watch) if f}, keep_values)
    output = None
    for label, args, kwargs in phases:
        first = len(recorder.steps)
        _input_steps(module, args, kwargs, recorder, label)
        try:
            with recorder:
                output = module(*args, **kwargs)
        except Exception as exc:
            failed = Trace(recorder.steps, None, recorder.failure)
            if failed.failure is None:
                failed.failure = _failure_of(exc, own_file)
            raise ForwardFailed(failed) from exc
        finally:
            for step in recorder.steps[first:]:
                step.phase = label
    return Trace(recorder.steps, output)
