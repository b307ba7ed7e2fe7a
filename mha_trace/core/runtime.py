"""Where a run happens: device and dtype checks, available memory, the memory guard, a step
replayed from a CUDA graph."""

import contextlib
import dataclasses
import os

import torch

from mha_trace.core.costs import Dims, forward_bytes, human_bytes, parameters, peak_bytes
from mha_trace.errors import MhaError

DTYPES = {"float32": torch.float32, "float64": torch.float64,
          "float16": torch.float16, "bfloat16": torch.bfloat16}


def needs_values(device: str, what: str) -> None:
    """Views that print numbers cannot run on meta, which holds none."""
    if device == "meta":
        raise MhaError(f"{what} needs numbers, and meta tensors hold none (meta is for shapes and "
                       f"cost: use --device cpu or cuda)", quantity="device")


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


LIMIT_SECONDS = 30  # the time guard: a trace estimated longer than this on 2 CPU cores is refused
FLOP_RATES = {"explicit": 15e9, "sdpa": 70e9, "tiled": 10e9}  # FLOP/s measured on 2 cores (bench/ has the run)


def guard_time(dims: Dims, device: torch.device, impl: str, runs: int = 1) -> None:
    """Refuse (exit 2) a CPU trace estimated over LIMIT_SECONDS, before computing anything."""
    from mha_trace.core.costs import flops

    if device.type != "cpu":
        return  # a GPU's rate is not known here; meta computes nothing
    estimate = runs * flops(dims) / FLOP_RATES[impl]
    if estimate > LIMIT_SECONDS:
        seconds = lambda seq: runs * flops(dataclasses.replace(dims, seq=seq)) / FLOP_RATES[impl]
        low, high = 0, dims.seq  # the most tokens that fit: seconds(low) fits, seconds(high) not
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if seconds(middle) <= LIMIT_SECONDS else (low, middle)
        raise MhaError(f"this run is {flops(dims) * runs / 1e9:,.0f} GFLOPs: about {estimate:,.0f} s "
                       f"on 2 CPU cores, and the guard stops at {LIMIT_SECONDS} s (--seq {low} fits; "
                       f"--device meta traces the shapes without computing)", quantity="seq")


def seed(value: int) -> None:
    """`torch.manual_seed` on the devices this tool runs on (the CPU, and CUDA and MPS where
    present): the same numbers. torch's own also queues a seed for each backend not started yet
    (XPU, MTIA), recording the caller's stack each time: about 5 ms a call from a deep stack, and
    verify seeds hundreds of times."""
    torch.default_generator.manual_seed(value)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(value)
    if torch.backends.mps.is_available():
        torch.mps.manual_seed(value)


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


def replayed(step, device: torch.device):
    """`step` (no arguments; the same shapes and buffers at every call) as it is off CUDA; on
    CUDA, run once as it is, then captured in a CUDA graph and replayed: the same kernels on the
    same buffers, launched with one call. A token through SmolLM2's 30 layers is about 1,700
    small kernels, and launching them one at a time from Python takes several times longer than
    running them. The step keeps what changes in tensors on the device (a cache's position), not
    in Python, and reads its input from a buffer that the caller fills before each call; what it
    returns is overwritten by the next call."""
    if device.type != "cuda":
        return step
    graph, stream, calls, out = torch.cuda.CUDAGraph(), torch.cuda.Stream(device), 0, None

    def run():
        nonlocal calls, out
        calls += 1
        if calls == 1:  # as it is, on the graph's stream: kernels load, lazy buffers are made
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                first = step()
            torch.cuda.current_stream(device).wait_stream(stream)
            return first
        if calls == 2:  # recorded, not run: the replay runs it
            with torch.cuda.graph(graph, stream=stream):
                out = step()
        graph.replay()
        return out

    return run
