"""The `shapes` analysis: trace one forward pass of a run and keep what it tells, as data.

>>> report = trace_run(resolve(RunOptions(d_model=512, heads=8), "sizes"))
>>> report.steps[3].shape, report.largest.op
((2, 8, 10, 64), 'matmul')
"""

import contextlib
import math
from dataclasses import dataclass
from typing import Any

from mha_trace.core.costs import DTYPE_BYTES
from mha_trace.records import Shows
from mha_trace.runs.run import Run
from mha_trace.speedups import light_meta_kernels
from mha_trace.core.tracer import Failure, ForwardFailed, Step, trace_phases


@dataclass
class ShapesReport(Shows):
    """Every op of one forward pass, with what the run cost. Renders itself (rich, Jupyter)."""

    run: Run
    steps: list[Step]
    parameters: dict  # per projection, from the module itself
    failure: Failure | None = None  # the op that raised (the user's module)
    returned: str = ""  # what forward returned, for a user's module
    output: Any = None  # the built-in module's output tensor (B, T, d_model)
    symbols: list | None = None  # --compact: each step's shape in symbols (the lecture's table)
    explicit: "ShapesReport | None" = None  # --compare-impl: the explicit path, traced beside

    @property
    def sizes(self):
        return self.run.sizes

    @property
    def estimate(self) -> int:
        return self.run.estimate

    @property
    def bytes_allocated(self) -> int:
        return sum(s.bytes for s in self.steps)

    @property
    def largest(self) -> Step:
        """The step whose tensor has the most elements (the first of equals)."""
        return max(self.steps, key=lambda s: (math.prod(s.shape), -s.index))

    @property
    def largest_made(self) -> Step:
        """The largest tensor the forward pass allocated itself (no input, no view)."""
        made = [s for s in self.steps if s.bytes and s.op != "input"] or self.steps
        return max(made, key=lambda s: (math.prod(s.shape), -s.index))

    @property
    def kv_cache_per_token(self) -> tuple[int, int] | None:
        """(bytes with the run's K/V heads, bytes with one K/V head per query head), one layer.

        None unless the built-in module shares K/V heads (grouped- or multi-query attention).
        """
        s = self.sizes
        if not self.run.builtin or not s.kv_heads or s.kv_heads == s.heads:
            return None
        per_head = 2 * (s.d_model // s.heads) * DTYPE_BYTES[s.dtype]  # K and V, d_k each
        return per_head * s.kv_heads, per_head * s.heads

    @property
    def query_len(self) -> int:
        return self.sizes.seq

    @property
    def key_len(self) -> int:
        return self.sizes.seq

    @property
    def fused_savings(self) -> int:
        """Bytes the explicit path spends on the (B, H, T, T) scores and weights."""
        from dataclasses import replace

        from mha_trace.core.costs import forward_bytes

        mask = "full" if self.run.mask is not None else "none"
        return forward_bytes(replace(self.sizes.dims(), mask=mask))["scores"]

    def max_diff(self, other: "ShapesReport") -> float | None:
        """The largest |difference| between this run's output and another's (None on meta)."""
        if self.output is None or other.output is None or self.output.is_meta:
            return None
        return (self.output.double() - other.output.double()).abs().max().item()

    @property
    def kv_cache_by_phase(self) -> list[tuple[str, int, int]]:
        """Decoding: (phase, tokens in the cache, bytes of K and V) after each call, one layer."""
        s = self.sizes
        if not s.decode or s.cross:  # a cross-attention's cache is filled once: it does not grow
            return []
        per_token = 2 * s.batch * (s.kv_heads or s.heads) * (s.d_model // s.heads) * DTYPE_BYTES[s.dtype]
        phases = ["prefill"] + [f"decode step {i + 1}" for i in range(s.decode)]
        return [(p, s.seq + i, per_token * (s.seq + i)) for i, p in enumerate(phases)]


def trace_run(run: Run) -> ShapesReport:
    """Trace the run's forward pass; a failure inside a user's module is kept, not raised."""
    from mha_trace.runs.usermodule import user_code

    guard = contextlib.nullcontext() if run.builtin else user_code(f"{run.label}: forward")
    with light_meta_kernels(run.device), guard:
        try:
            if run.numpy:
                from mha_trace.core import nptrace

                result = nptrace.trace(run.module, *run.args, watch=(run.source,), **run.kwargs)
            else:
                phases = run.phases or [("", run.args, run.kwargs)]
                result = trace_phases(run.module, phases, watch=(run.source,))
        except ForwardFailed as failed:
            return ShapesReport(run, failed.trace.steps, layer_parameters(run.module),
                                failed.trace.failure)
    returned, output = "", result.output[0] if run.builtin else None
    if not run.builtin:
        from mha_trace.runs.returned import split_result

        output, weights = split_result(result.output, run.args[0])
        returned = f"output {list(output.shape)}" + (
            f" and weights {list(weights.shape)}" if weights is not None else " (no weights)")
    return ShapesReport(run, result.steps, layer_parameters(run.module), None, returned, output)


def layer_parameters(module) -> dict:
    """Parameter count per child layer and per parameter of the module's own (a sink); for a NumPy class, the
    numbers in each of its array attributes (W_q, W_k, ...)."""
    if not hasattr(module, "named_children"):
        import numpy as np

        return {name: value.size for name, value in getattr(module, "__dict__", {}).items()
                if isinstance(value, np.ndarray) and np.issubdtype(value.dtype, np.number)}
    counts = {name: sum(p.numel() for p in layer.parameters())
              for name, layer in module.named_children()}
    own = {name: p.numel() for name, p in module.named_parameters(recurse=False)}
    return counts | own if counts or own else {"(own)": 0}


def shape_symbols(probe: ShapesReport) -> list[str]:
    """Each step's shape in symbols, (B, H, T, d_k), read off a probe's trace: the same module on
    the meta device with distinct prime sizes (resolve.symbols_probe), so every dimension's role
    shows by its value."""
    names = {2: "B", 11: "T", 6: "H", 14: "d_k", 84: "d_model", 3: "H_kv", 42: "H_kv·d_k"}
    return ["(" + ", ".join(names.get(d, str(d)) for d in p.shape) + ")" for p in probe.steps]
