"""Where a run happens: device and dtype checks, available memory, the memory guard."""

import contextlib
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


def _cgroup_free() -> int | None:
    try:
        with open("/sys/fs/cgroup/memory.max") as f:
            limit = f.read().strip()
        with open("/sys/fs/cgroup/memory.current") as f:
            used = int(f.read())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else int(limit) - used


def available_bytes(device: torch.device) -> int | None:
    """Free memory on the device, or None where it cannot be told (meta needs none)."""
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
    cgroup = _cgroup_free()
    if cgroup is not None:
        free = cgroup if free is None else min(free, cgroup)
    if free is None and hasattr(os, "sysconf"):
        free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return free


def guard_memory(dims: Dims, device: torch.device, runs: int = 1,
                 hint: str = "use --device meta to trace the shapes without allocating") -> int:
    """Refuse (exit 1) before allocating anything when the run would not fit; return the estimate.

    runs: how many forward passes of this size are alive together (verify keeps its references').
    """
    need = peak_bytes(dims) * runs
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
def light_meta_kernels(device: torch.device):
    """On the meta device, keep torch from importing torch._dynamo (about 0.65 s) mid-forward.

    Many meta kernels are Python reference implementations wrapped in `_disable_dynamo`, whose
    first call imports all of torch._dynamo only to mark the function "do not compile". Nothing
    is compiled here, so while the forward runs a stand-in module answers that import, and the
    wrapper calls the reference directly. Real torch._dynamo, if already imported, is left alone.
    """
    if device.type != "meta" or "torch._dynamo" in sys.modules:
        yield
        return
    stand_in = types.ModuleType("torch._dynamo")
    stand_in.disable = lambda fn, recursive=True, wrapping=True: fn
    sys.modules["torch._dynamo"] = stand_in
    try:
        yield
    finally:
        if sys.modules.get("torch._dynamo") is stand_in:
            del sys.modules["torch._dynamo"]
