"""Where a run happens: device and dtype checks, available memory, the memory guard."""

import contextlib
import importlib
import os
import sys
import types

import torch

from mha_trace.cost import Dims, forward_bytes, human_bytes, parameters, peak_bytes
from mha_trace.errors import MhaError

DTYPES = {"float32": torch.float32, "float64": torch.float64,
          "float16": torch.float16, "bfloat16": torch.bfloat16}


def check_device(device: str) -> torch.device:
    """The torch device for a --device value; exit 1 with a clear line when it is not there."""
    if device == "cuda" and not torch.cuda.is_available():
        raise MhaError(f"--device cuda was asked for, but CUDA is not available to torch "
                       f"{torch.__version__} here (try --device cpu, or --device meta for shapes only)",
                       exit_code=1)
    if device == "mps" and not torch.backends.mps.is_available():
        raise MhaError("--device mps was asked for, but Apple's MPS backend is not available here "
                       "(try --device cpu, or --device meta for shapes only)", exit_code=1)
    return torch.device(device)


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max" (v2) means no limit


def _cgroup_free() -> int | None:
    """What the memory cgroup still allows: v2 (memory.max) or v1 (memory.limit_in_bytes)."""
    for limit_file, used_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                  ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                   "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        limit, used = _read_int(limit_file), _read_int(used_file)
        if limit is not None and used is not None and limit < 2**60:  # v1 writes ~2**63 for none
            return max(limit - used, 0)
    return None


def _address_space_free() -> int | None:
    """RLIMIT_AS (ulimit -v) less this process's own address space (torch alone maps GBs)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError):
        return None
    if soft == resource.RLIM_INFINITY:
        return None
    size = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmSize:"):
                    size = int(line.split()[1]) * 1024
    except OSError:
        pass
    return max(soft - (size or 0), 0)


def available_bytes(device: torch.device) -> int | None:
    """Free memory on the device, or None where it cannot be told (meta needs none).

    On the CPU the smallest of: MemAvailable, what the memory cgroup (v1 or v2) still allows,
    and the address space RLIMIT_AS leaves this process (its own baseline counted).
    """
    if device.type == "meta":
        return None
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    free = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        pass
    if free is None and hasattr(os, "sysconf"):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError):
            pass
    limits = [x for x in (free, _cgroup_free(), _address_space_free()) if x is not None]
    return min(limits) if limits else None


def guard_memory(dims: Dims, device: torch.device, runs: int = 1,
                 hint: str = "use --device meta to trace the shapes without allocating",
                 need: int | None = None) -> int:
    """Refuse (exit 1) before allocating anything when the run would not fit; return the estimate.

    runs: how many forward passes of this size are alive together (verify keeps its references').
    need: the bytes of one pass when already counted (a meta trace); else the formula's.
    """
    need = (peak_bytes(dims) if need is None else need) * runs
    free = available_bytes(device)
    if free is not None and need > free:
        params = sum(parameters(dims).values()) * dims.itemsize
        scores = forward_bytes(dims)["scores"]
        raise MhaError(
            f"this run needs about {human_bytes(need)} on {device.type} (parameters "
            f"{human_bytes(params)}, score tensors {human_bytes(scores)}) but only "
            f"{human_bytes(free)} is free ({hint})", exit_code=1)
    return need


@contextlib.contextmanager
def one_thread():
    """Compute on one thread: float sums then add in one order whatever OMP_NUM_THREADS says,
    so printed differences are the same on every machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@contextlib.contextmanager
def light_meta_kernels(device: torch.device):
    """On the meta device, keep torch from importing torch._dynamo and sympy mid-forward.

    Many meta kernels are Python reference implementations that pay for machinery they do not
    use here: `_disable_dynamo` imports all of torch._dynamo (about 0.65 s) only to mark a
    function "do not compile"; `torch._check` imports torch.fx.experimental.symbolic_shapes only
    for `expect_true`, which returns a plain bool unchanged; and type promotion imports sympy
    (about 0.28 s) only to ask whether an argument is a sympy expression. Nothing is compiled and
    no shape is symbolic here, so while the forward runs, stand-ins answer those three imports
    with just those names; any other name asked of a stand-in loads the real module. Modules
    already imported are left alone.
    """
    if device.type != "meta":
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
        "torch._dynamo": {"disable": lambda fn, recursive=True, wrapping=True: fn},
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
    stand_in.__stand_in__ = True

    def other(attr: str):
        if attr.startswith("__"):  # the import system asks for __path__ and friends
            raise AttributeError(attr)
        return getattr(_real(name), attr)

    stand_in.__getattr__ = other
    return stand_in


def _real(name: str) -> types.ModuleType:
    """The real module, importing it in place of its stand-in."""
    if getattr(sys.modules.get(name), "__stand_in__", False):
        del sys.modules[name]
    return importlib.import_module(name)
