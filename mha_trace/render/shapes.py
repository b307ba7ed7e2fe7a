"""Turn a ShapesReport into a rich table, plain-words notes, and JSON data."""

import math
import os

from rich.console import Group
from rich.table import Table
from rich.text import Text

from mha_trace.cost import DTYPE_BYTES, human_bytes
from mha_trace.output import display_path, new_table
from mha_trace.shapes import ShapesReport

SHORT_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
                "bool": "bool", "int64": "i64"}


def _shape(t: tuple) -> str:
    return "[" + ", ".join(map(str, t)) + "]"


def _stride(t: tuple) -> str:
    return "(" + ", ".join(map(str, t)) + ")"


def _rows(steps, op) -> str:
    rows = [str(s.index) for s in steps if s.op == op]
    return ("row " if len(rows) == 1 else "rows ") + ", ".join(rows)


def title(report: ShapesReport) -> str:
    r, run = report.sizes, report.run
    kv = f" kv_heads={r.kv_heads}" if r.kv_heads and r.kv_heads != r.heads else ""
    mask = f" mask={r.mask}" if r.mask != "none" else ""
    pad = f" pad={r.pad}" if r.pad else ""
    who = f"{run.label}, {run.call}: " if run.label else ""
    extra = "".join([" rope" if r.rope else "", f" window={r.window}" if r.window else "",
                     " impl=sdpa" if r.impl != "explicit" else "",
                     f" decode={r.decode}" if r.decode else ""])
    d_k = f" (d_k={r.d_model // r.heads})" if r.d_model % r.heads == 0 else ""
    return (f"shapes: {who}batch={r.batch} seq={r.seq} d_model={r.d_model} heads={r.heads}{kv}"
            f"{d_k}{mask}{pad}{extra} {r.dtype} on {r.device}")


def shapes_table(report: ShapesReport, width: int = 100):
    """One row per op. Below 100 columns the stride and dtype columns give way to the code."""
    wide = width >= 100
    table = new_table(title(report))
    if not wide:
        table.caption = "stride and dtype hidden below 100 columns (see them with --width 100)"
        table.caption_justify = "left"
    table.add_column("#", justify="right")
    files = {s.file for s in report.steps if s.op != "input"}
    table.add_column("ln" if len(files) <= 1 else "file:ln", justify="right")
    table.add_column("code", overflow="fold", ratio=1, min_width=12)
    table.add_column("op", overflow="fold", min_width=10, max_width=11)
    table.add_column("shape", overflow="fold", max_width=16)
    if wide:
        table.add_column("stride", overflow="fold", max_width=18)
    table.add_column("contig")
    if wide:
        table.add_column("dtype")
    table.add_column("alloc", justify="right", no_wrap=True)
    phase = ""
    for s in report.steps:
        if s.phase != phase:
            phase = s.phase
            table.add_section()
            table.add_row("", "", Text(phase_label(report, phase), style="bold magenta"),
                          *[""] * (len(table.columns) - 3))
        alloc = Text("view", style="green") if s.is_view else Text(human_bytes(s.bytes), style="yellow")
        where = str(s.line) if len(files) <= 1 else f"{os.path.basename(s.file)}:{s.line}"
        cells = [str(s.index), where if s.line else "in", s.text, s.op, _shape(s.shape)]
        cells += [_stride(s.stride)] if wide else []
        cells += ["yes" if s.contiguous else "no"]
        cells += [SHORT_DTYPES.get(s.dtype, s.dtype)] if wide else []
        table.add_row(*cells, alloc,
                      style="bold" if s.op == "contiguous" and not s.is_view else None)
    return table


def phase_label(report: ShapesReport, phase: str) -> str:
    """'prefill: tokens 0-9' / 'decode step 2: token 11'."""
    T = report.sizes.seq
    if phase == "prefill":
        return f"prefill: tokens 0–{T - 1}"
    step = int(phase.rsplit(" ", 1)[1])
    return f"step {step}: token {T + step - 1}"


def modern_notes(report: ShapesReport) -> list[str]:
    """RoPE, the sliding window, the fused path and the KV cache, in plain words."""
    r, lines = report.sizes, []
    if r.rope:
        lines.append(f"RoPE: Q and K of each head are turned pair by pair (dims i and i + d_k/2, "
                     f"the rotate-half pairing of LLaMA) by position · {r.rope_base:g}^(-2i/d_k); "
                     f"V is not turned, and no parameter is added.")
    if r.window is not None:
        lines.append(f"Sliding window: query i sees keys i - {r.window - 1} .. i (at most "
                     f"{r.window}, itself included); the band is built inside forward.")
    if r.impl == "sdpa":
        saved = report.fused_savings
        lines.append(f"Fused path: F.scaled_dot_product_attention never forms the "
                     f"[{r.batch}, {r.heads}, {report.query_len}, {report.key_len}] scores or "
                     f"weights; the explicit path allocates {human_bytes(saved)} for them "
                     f"(QKᵀ, ÷√d_k, softmax{', the two masked_fills' if report.run.mask is not None else ''}).")
    cache = report.kv_cache_by_phase
    if cache:
        per_token = cache[-1][2] // cache[-1][1]
        kv = r.kv_heads or r.heads
        steps = ", ".join(f"{tokens} tokens {human_bytes(size)}" for _, tokens, size in cache)
        lines.append(f"KV cache (one layer): {steps}; {human_bytes(per_token)} per token "
                     f"(2 · B · Hkv · d_k · s = 2 · {r.batch} · {kv} · {r.d_model // r.heads} · "
                     f"{DTYPE_BYTES[r.dtype]}). It grows by concatenation: each step's torch.cat "
                     f"copies the whole cache (a preallocated cache would write in place).")
    return lines


def compare_impl_table(explicit: ShapesReport, fused: ShapesReport) -> list:
    """Explicit against fused: what each allocates, and the tensors only the explicit path makes."""
    table = new_table("Explicit against fused (the same sizes, mask and weights)")
    table.add_column("implementation")
    table.add_column("new tensors", justify="right")
    table.add_column("allocated", justify="right")
    table.add_column("largest tensor")
    for name, rep in (("explicit (the lecture's formula)", explicit),
                      ("sdpa (F.scaled_dot_product_attention)", fused)):
        big = rep.largest
        table.add_row(name, str(sum(1 for s in rep.steps if s.bytes)), human_bytes(rep.bytes_allocated),
                      f"{big.op} {_shape(big.shape)}")
    gone = [s for s in explicit.steps if len(s.shape) == 4 and s.shape[-1] == explicit.key_len
            and s.shape[-2] == explicit.query_len and s.bytes]
    lines = [f"Never materialised by the fused path: " + "; ".join(
        f"row {s.index} {s.op} {_shape(s.shape)} {human_bytes(s.bytes)}" for s in gone) + "."]
    lines.append(f"Saved: {human_bytes(explicit.bytes_allocated - fused.bytes_allocated)} of "
                 f"{human_bytes(explicit.bytes_allocated)}; the outputs agree (the tests check it).")
    return [table, Text("\n".join(lines))]


def shapes_notes(report: ShapesReport) -> Group:
    """Plain words for students: what view, transpose and contiguous did in this run."""
    steps, r = report.steps, report.sizes
    notes = Table.grid(padding=(0, 2))
    notes.add_column(no_wrap=True)
    notes.add_column()
    if any(s.op == "view" for s in steps):
        notes.add_row("  view", f"{_rows(steps, 'view')}: new shape and strides over the same "
                                "memory; no data moved, 0 bytes.")
    if any(s.op == "transpose" for s in steps):
        notes.add_row("  transpose", f"{_rows(steps, 'transpose')}: two strides swapped; no data "
                                     "moved, so the result is not contiguous.")
    for s in steps:
        if s.op == "contiguous" and not s.is_view:
            notes.add_row("  contiguous", f"row {s.index}: copied {human_bytes(s.bytes)} into a "
                                          "fresh row-major block, so that .view can merge heads.")
        elif s.op == "contiguous":
            notes.add_row("  contiguous", f"row {s.index}: already contiguous, so it returned "
                                          "itself (no copy).")
    if any(s.op == "repeat_interleave" for s in steps):
        notes.add_row("  repeat", f"{_rows(steps, 'repeat_interleave')}: each K/V head copied for "
                                  f"{r.heads // r.kv_heads} query heads (grouped-query attention).")
    p = report.parameters
    lines = [f"Parameters: {sum(p.values()):,} ("
             + " · ".join(f"{k} {v:,}" for k, v in p.items()) + ")"]
    new = [s for s in steps if s.bytes]
    verb = "would allocate" if r.device == "meta" else "allocated"
    lines.append(f"Forward pass {verb} {human_bytes(report.bytes_allocated)} in {len(new)} new "
                 "tensors (inputs included).")
    big = report.largest
    lines.append(f"Largest tensor: row {big.index} {big.text} {_shape(big.shape)}, "
                 f"{human_bytes(math.prod(big.shape) * big.itemsize)}.")
    if report.kv_cache_per_token:
        kv, full = report.kv_cache_per_token
        lines.append(f"KV cache per token per layer: {human_bytes(kv)} with {r.kv_heads} K/V heads "
                     f"against {human_bytes(full)} with {r.heads} ({human_bytes(full - kv)} saved, "
                     f"{r.heads // r.kv_heads}× less).")
    lines += modern_notes(report)
    if r.device == "meta":
        lines.append("Device meta: shapes and strides are real, nothing was allocated.")
    if report.returned:
        lines.insert(0, f"forward returned {report.returned}.")
    path = internal_path(steps)
    if path:
        lines.append(path)
    return Group(Text(f"Source: {display_path(steps[-1].file)}. What the reshapes did here:"),
                 notes, Text(""), Text("\n".join(lines)))


def internal_path(steps) -> str:
    """torch.nn.MultiheadAttention hides its ops inside one call: say which one and why."""
    ops = {s.op for s in steps}
    if "_native_multi_head_attention" in ops:
        return ("nn.MultiheadAttention took its fused fast path (torch._native_multi_head_attention: "
                "eval mode, no autograd): one kernel, so the per-op detail is not visible.")
    if "multi_head_attention_forward" in ops:
        return ("nn.MultiheadAttention handed everything to F.multi_head_attention_forward in one "
                "call (its fused fast path needs eval mode); the tracer sees that call as one step, "
                "so the per-op detail is hidden inside it.")
    if "scaled_dot_product_attention" in ops:
        return ("F.scaled_dot_product_attention is one fused call: QKᵀ, scaling, softmax and the "
                "weighted sum of V happen inside it, and the weights are never formed.")
    return ""


def failure_renderables(report: ShapesReport) -> list:
    """The trace up to the failing op, then the op, its line, its inputs and torch's message."""
    f = report.failure
    ins = ", ".join(_shape(i) for i in f.inputs) or "none"
    where = f"{display_path(f.file)}:{f.line}" if f.line else display_path(f.file)
    lines = [f"forward raised at {where}", f"    {f.source}", f"op: {f.op} ({f.text})",
             f"input shapes: {ins}", f"torch says: {f.message}"]
    hint = failure_hint(f)
    if hint:
        lines.append(f"hint: {hint}")
    return [Text("\n".join(lines), style="bold red")]


def failure_hint(f) -> str:
    if f.op == "view" and "contiguous" in f.message:
        return ("the input to .view() is not contiguous (a transpose made it so); call "
                ".contiguous() first, or use .reshape()")
    if f.op in ("matmul", "linear", "mm", "bmm") and "shapes cannot be multiplied" in f.message:
        return "the inner dimensions differ; check the last dim of the left and the rows of the right"
    return ""


def shapes_data(report: ShapesReport) -> dict:
    r = report.sizes
    return {
        "command": "shapes",
        "config": {"batch": r.batch, "seq": r.seq, "d_model": r.d_model, "heads": r.heads,
                   "kv_heads": r.kv_heads or r.heads, "d_k": r.d_model // r.heads,
                   "device": r.device, "dtype": r.dtype, "mask": r.mask, "pad": r.pad,
                   "seed": r.seed, "rope": r.rope, "rope_base": r.rope_base,
                   "window": r.window, "impl": r.impl, "decode": r.decode},
        "steps": [{"step": s.index, "op": s.op, "text": s.text, "file": display_path(s.file), "line": s.line,
                   "source": s.source, "shape": list(s.shape), "stride": list(s.stride),
                   "contiguous": s.contiguous, "view": s.is_view, "dtype": s.dtype,
                   "bytes": s.bytes, "inputs": [list(i) for i in s.inputs], "phase": s.phase}
                  for s in report.steps],
        "failure": None if not report.failure else {
            "op": report.failure.op, "text": report.failure.text,
            "file": display_path(report.failure.file), "line": report.failure.line,
            "source": report.failure.source, "inputs": [list(i) for i in report.failure.inputs],
            "message": report.failure.message, "hint": failure_hint(report.failure) or None},
        "summary": {"parameters": sum(report.parameters.values()),
                    "parameters_by_layer": report.parameters,
                    "bytes_allocated": report.bytes_allocated,
                    "estimated_peak_bytes": report.estimate},
    }
