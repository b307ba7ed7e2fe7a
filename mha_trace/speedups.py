"""Start-up speed-ups, all in one place but the command line's option coercion (typer's own
business, in `cli/coercion.py`): each one is a trick on a library's internals, guarded so that a
version without those internals simply runs without it.

`MHA_TRACE_NO_SPEEDUPS=1` turns every one off; everything works the same, only slower (the tests
run both ways). None of them changes a number the tool prints.

- `no_garbage_collection()`: the collector off for one short command (the CLI's `main`);
- `fast_exit(code)`: leave without torch's interpreter teardown once everything is flushed;
- `return_freed_memory()`: large blocks from mmap, so a model's temporaries go back to the OS;
- `one_thread_for_models()`: a sentence through a small model is quicker on one thread, and
  `batch_work()` gives the cores back (and heap memory) for batches of sentences or copies;
- `meta_kernels_later(spec)`: torch's first import without its Python meta kernels, loaded
  when a meta-device forward first needs them;
- `light_meta_kernels(device)`: a meta-device forward without importing torch._dynamo and sympy;
- `optimiser_without_dynamo()`: training without importing torch._dynamo;
- `artists_without_set_docs()`: matplotlib's first import (for a slide) without writing the
  signature and docstring of every Artist class's `set()`.
"""

import contextlib
import gc
import importlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import types
from pathlib import Path

ENABLED = os.environ.get("MHA_TRACE_NO_SPEEDUPS", "").strip().lower() not in ("1", "true", "yes")
_OWN_PROCESS = False  # the command line's process: settings of the whole process are ours to set


def own_the_process() -> None:
    """The command line owns its process: thread counts and the allocator's threshold may be set
    for it. A library call never sets them in the user's process (a notebook keeps its own)."""
    global _OWN_PROCESS
    _OWN_PROCESS = True


def no_garbage_collection() -> None:
    """Importing torch creates hundreds of thousands of objects and no cycles worth collecting;
    for one short command the collections would cost about 0.15 s."""
    if ENABLED:
        gc.disable()


def fast_exit(code: int) -> None:
    """torch's interpreter teardown alone costs about 0.3 s and nothing of ours needs it: once
    everything is written and flushed, leave at once (a no-op without torch or the speed-ups)."""
    if ENABLED and "torch" in sys.modules:
        os._exit(code)


def return_freed_memory() -> None:
    """Large blocks always from mmap, so freed ones go back to the OS at once.

    glibc raises its mmap threshold after large blocks are freed, and the next ones then come from
    the heap and stay there: dequantising a model layer by layer would keep every temporary's
    pages (SmolLM2's peak RSS went from 446 MB to 792 MB). Linux with glibc only; elsewhere a no-op.
    """
    if ENABLED and _OWN_PROCESS:
        _mmap_threshold(128 * 1024)  # fixed at 128 KiB


def one_thread_for_models() -> None:
    """One sentence through a small model: one thread is quicker than handing out the work."""
    if ENABLED and _OWN_PROCESS:
        import torch

        torch.set_num_threads(1)


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's or a scheduler's share)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # no affinity on this platform
        return os.cpu_count() or 1


@contextlib.contextmanager
def batch_work():
    """Many sentences, or many copies of one, through a model: every core helps there, and
    temporaries come from the heap (fresh mapped pages cost more than the work on them)."""
    import torch

    before = torch.get_num_threads()
    owned = ENABLED and _OWN_PROCESS
    if owned:
        torch.set_num_threads(usable_cores())
        _mmap_threshold(256 * 1024 * 1024)
    try:
        yield
    finally:
        if owned:
            torch.set_num_threads(before)
            _mmap_threshold(128 * 1024)


def _mmap_threshold(size: int) -> None:
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(-3, size)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass


TORCH_CHECKED = "2.13."  # the torch release whose import `meta_kernels_later` was checked with


@contextlib.contextmanager
def meta_kernels_later(spec):
    """torch's first import (`spec`: its module spec) without torch._meta_registrations, which
    costs about 0.15 s of the 1 s that import takes here.

    That module holds the Python kernels of the meta device, and brings torch._decomp and
    torch._refs with it, the decompositions torch.compile uses. A forward on the CPU or a GPU
    runs none of them. While torch is imported, a stand-in takes the module's place: a name asked
    of it loads the real module. The stand-in is removed as the import ends, so the module's next
    import loads it as usual (torch.compile and fake tensors import it themselves), and
    `light_meta_kernels` loads it before a forward on the meta device, whose shapes stay torch's
    own. Only for the torch release this was checked with: there `torch.Generator()` needs
    torch._prims, which the module would have loaded (it is loaded here), and importing (or
    reading) `torch._refs` or `torch._decomp` loads the kernels first (`_KernelsFirst`); another
    release may tie more to it.
    """
    if not (ENABLED and _torch_release(spec).startswith(TORCH_CHECKED)):
        yield
        return
    with _standing_in({"torch._meta_registrations": {}}):
        yield
    import torch._prims.rng_prims  # noqa: F401 (sets the metaclass torch.Generator() needs)

    sys.meta_path.insert(0, _KernelsFirst())
    _imported_when_read(sys.modules["torch"], _KERNELS_FIRST)


_KERNELS_FIRST = ("_refs", "_decomp")  # torch's modules that only the meta kernels import in order


class _KernelsFirst(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`torch._decomp` and `torch._refs` (and the modules in them), imported by anyone, come with
    the meta kernels, which import them in the one order that works: imported first, either one
    imports itself in a circle (torch.vmap, torch.func, torch.testing.assert_close,
    torch.utils.checkpoint and torch.compile all import torch._decomp). The module asked for is
    then the one the kernels imported, not a second copy."""

    def find_spec(self, name, path=None, target=None):
        parts = name.split(".")
        if parts[0] != "torch" or len(parts) < 2 or parts[1] not in _KERNELS_FIRST:
            return None
        sys.meta_path.remove(self)
        meta_kernels()
        if name not in sys.modules:  # one the kernels do not import: an ordinary import now
            return None
        self.module = sys.modules.pop(name)  # else the import system would run it again
        self.spec = self.module.__spec__
        return importlib.machinery.ModuleSpec(
            name, self, is_package=self.spec.submodule_search_locations is not None)

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__ = self.spec  # the import system gave it this finder's spec


def _imported_when_read(torch, names: tuple) -> None:
    """`torch._refs` and `torch._decomp` imported when first read as torch's attributes
    (torch.broadcast_shapes reads torch._refs), through `_KernelsFirst`."""
    found = torch.__dict__.get("__getattr__")

    def __getattr__(name: str):
        if name in names:
            return importlib.import_module(f"torch.{name}")
        if found is None:
            raise AttributeError(f"module 'torch' has no attribute '{name}'")
        return found(name)

    torch.__getattr__ = __getattr__


def _torch_release(spec) -> str:
    """The release in torch's version.py (beside its __init__.py), read without importing it."""
    try:
        text = (Path(spec.origin).parent / "version.py").read_text("utf-8")
    except (AttributeError, TypeError, OSError):
        return ""
    found = re.search(r"^__version__ = '([^']*)'", text, re.M)
    return found.group(1) if found else ""


def meta_kernels() -> None:
    """torch's Python meta kernels, loaded if `meta_kernels_later` left them out."""
    import torch._meta_registrations  # noqa: F401


@contextlib.contextmanager
def light_meta_kernels(device, forward: bool = True):
    """On the meta device, keep torch from importing torch._dynamo and sympy mid-forward.

    A forward's shapes come from torch's Python meta kernels, loaded first where the start-up
    left them out (`meta_kernels_later`); building a model's skeleton (`forward=False`) needs
    none of them.

    Many meta kernels are Python reference implementations that pay for machinery they do not
    use here: `_disable_dynamo` imports all of torch._dynamo (about 0.65 s) only to mark a
    function "do not compile"; `torch._check` imports torch.fx.experimental.symbolic_shapes only
    for `expect_true`, which returns a plain bool unchanged; and type promotion imports sympy
    (about 0.28 s) only to ask whether an argument is a sympy expression. Nothing is compiled and
    no shape is symbolic here, so while the forward runs, stand-ins answer those three imports
    with just those names; any other name asked of a stand-in loads the real module. Modules
    already imported are left alone.
    """
    if device.type == "meta" and forward:
        meta_kernels()
    if device.type != "meta" or not ENABLED:
        yield
        return

    class NoSympyExpression:  # nothing is a sympy expression before sympy is imported
        pass

    shapes = "torch.fx.experimental.symbolic_shapes"

    def concrete(name: str, answer):
        """`name` as symbolic_shapes has it, answered without it for plain ints and bools."""
        return lambda a, *rest: answer(a) if type(a) in (bool, int) else getattr(
            _real(shapes), name)(a, *rest)

    def joined(name: str, join):
        """sym_and / sym_or: for plain bools, all() / any()."""
        return lambda *a: join(a) if all(type(x) is bool for x in a) else getattr(
            _real(shapes), name)(*a)

    stand_ins = {
        "torch._dynamo": NOT_COMPILED,
        shapes: {**{name: concrete(name, lambda a: a) for name in (
                     "expect_true", "guard_or_false", "guard_or_true", "guard_size_oblivious",
                     "guard_int", "statically_known_true", "guarding_hint_or_throw")},
                 "statically_known_false": concrete("statically_known_false", lambda a: not a),
                 "has_guarding_hint": concrete("has_guarding_hint", lambda a: True),
                 "is_nested_int": concrete("is_nested_int", lambda a: False),
                 "sym_and": joined("sym_and", all), "sym_or": joined("sym_or", any),
                 "sym_eq": lambda x, y: x == y if _plain_shape(x) and _plain_shape(y) else
                 _real(shapes).sym_eq(x, y)},
        "sympy": {"Basic": NoSympyExpression},
    }
    with _standing_in(stand_ins):
        yield


NOT_COMPILED = {"disable": lambda fn, recursive=True, wrapping=True: fn}  # torch._dynamo's


@contextlib.contextmanager
def optimiser_without_dynamo():
    """Training: the optimiser's methods are marked "do not compile" by `_disable_dynamo`, which
    imports all of torch._dynamo (about 1 s of a 6 s run) at their first call, and `step` asks it
    for a graph break. Nothing is compiled here, so a stand-in answers `disable` with the function
    itself and `graph_break` with nothing."""
    if not ENABLED:
        yield
        return
    with _standing_in({"torch._dynamo": {**NOT_COMPILED, "graph_break": lambda: None}}):
        yield


@contextlib.contextmanager
def artists_without_set_docs():
    """matplotlib's first import in the command line's process without the `set()` docs.

    As matplotlib defines each of its Artist classes (about a hundred: lines, patches, text,
    axes, ...), it writes that class's `set()` a signature and a docstring listing every property
    it takes, found by inspecting every setter: 0.11 s of the 0.4 s the import takes here, and
    nothing draws with them (`Artist.set` never reads its own signature). While pyplot is
    imported, each class only gets the mark its subclasses look for; the method is restored after,
    so a class defined later gets its docs as usual. A library call in the user's process (a
    notebook's `help(Line2D.set)`) is never touched."""
    if not (ENABLED and _OWN_PROCESS) or "matplotlib.pyplot" in sys.modules:
        yield
        return
    from matplotlib.artist import Artist

    original = Artist.__dict__.get("_update_set_signature_and_docstring")
    if not isinstance(original, classmethod):  # another matplotlib: nothing to leave out
        yield
        return
    Artist._update_set_signature_and_docstring = classmethod(_set_marked)
    try:
        yield
    finally:
        Artist._update_set_signature_and_docstring = original


def _set_marked(cls) -> None:
    """What matplotlib's subclasses look for on an Artist's generated `set()`."""
    cls.set._autogenerated_signature = True


@contextlib.contextmanager
def _standing_in(stand_ins: dict):
    """Stand-ins for modules not yet imported, each answering only the names given (any other
    name loads the real module), removed afterwards."""
    placed = {name: _stand_in(name, names) for name, names in stand_ins.items()
              if name not in sys.modules}
    sys.modules.update(placed)
    try:
        yield
    finally:
        for name, module in placed.items():
            if sys.modules.get(name) is module:
                del sys.modules[name]


def _plain_shape(x) -> bool:
    return type(x) is int or (isinstance(x, (tuple, list)) and all(type(i) is int for i in x))


def _stand_in(name: str, names: dict) -> types.ModuleType:
    stand_in = types.ModuleType(name)
    stand_in.__dict__.update(names)
    setattr(stand_in, "__stand_in__", True)

    def other(attr: str):
        if attr.startswith("__"):  # the import system asks for __path__ and friends
            raise AttributeError(attr)
        return getattr(_real(name), attr)

    setattr(stand_in, "__getattr__", other)  # a module's own __getattr__ (PEP 562)
    return stand_in


def _real(name: str) -> types.ModuleType:
    """The real module, importing it in place of its stand-in."""
    if getattr(sys.modules.get(name), "__stand_in__", False):
        del sys.modules[name]
    return importlib.import_module(name)
