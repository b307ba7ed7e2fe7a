"""Turn a ShapesReport into a rich table, plain-words notes, and JSON data."""

import math
import os

from rich.console import Group
from rich.table import Table
from rich.text import Text

from mha_trace.core.costs import human_bytes
from mha_trace.io.units import shape_text
from mha_trace.io.output import display_path, new_table
from mha_trace.records import data, renderables
from mha_trace.analyses.shapes import ShapesReport
from mha_trace.render.modern import modern_notes
from mha_trace.render.steps import elide, title

SHORT_DTYPES = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
                "bool": "bool", "int64": "i64"}


def stride_text(t: tuple, compact: bool = False) -> str:
    return "(" + ("," if compact else ", ").join(map(str, t)) + ")"


_LAYOUT = {  # a change of layout that moved no data, in plain words
    "view": "new shape and strides over the same memory; no data moved, 0 bytes.",
    "reshape": "a new shape over the same memory; no data moved, 0 bytes.",
    "flatten": "dims merged over the same memory; no data moved, 0 bytes.",
    "unflatten": "one dim split in several over the same memory; no data moved, 0 bytes.",
    "transpose": "two strides swapped; no data moved, so the result is not contiguous.",
    "swapaxes": "two strides swapped; no data moved, so the result is not contiguous.",
    "mT": "the last two strides swapped; no data moved, so the result is not contiguous.",
    "permute": "the strides reordered; no data moved, so the result is not contiguous.",
}


def _rows(steps, op) -> str:
    rows = [str(s.index) for s in steps if s.op == op]
    return ("row " if len(rows) == 1 else "rows ") + ", ".join(rows)


CODE_MIN = 16  # below this the code says too little: an optional column gives way instead
GIVE_WAY = ("dtype", "contig", "stride")  # in this order


def _cells(report: ShapesReport, where) -> dict:
    """Each column's text per step, code excepted."""
    steps = report.steps
    return {"#": [str(s.index) for s in steps], "ln": [where(s) for s in steps],
            "op": [s.op for s in steps], "shape": [shape_text(s.shape) for s in steps],
            "stride": [stride_text(s.stride, compact=True) for s in steps],
            "contig": ["yes" if s.contiguous else "no" for s in steps],
            "dtype": [SHORT_DTYPES.get(s.dtype, s.dtype) for s in steps],
            "alloc": ["view" if s.is_view else human_bytes(s.bytes) for s in steps]}


def shapes_table(report: ShapesReport, width: int = 100):
    """One line per op. Every column but the code takes the width its longest cell needs (strides
    without spaces); the code takes the rest, its middle elided when longer. When the code would
    get fewer than CODE_MIN columns, dtype, then contig, then stride give way, and the caption
    names the width that shows them; dtype is left out anyway when every step has the title's."""
    steps = report.steps
    files = {s.file for s in steps if s.op != "input"}
    ln = "ln" if len(files) <= 1 else "file:ln"
    where = lambda s: (str(s.line) if len(files) <= 1 else f"{os.path.basename(s.file)}:{s.line}") \
        if s.line else "in"
    cells = _cells(report, where)
    need = {c: max(len(v) for v in [c if c != "ln" else ln, *texts]) for c, texts in cells.items()}
    shown = [c for c in cells if c != "dtype" or len(set(cells["dtype"])) > 1]
    room = lambda cols: width - sum(need[c] for c in cols) - 2 * len(cols)
    full = sum(need[c] for c in shown) + 2 * len(shown) + max(len(s.text) for s in steps)
    hidden = []
    for optional in GIVE_WAY:
        if room(shown) >= CODE_MIN:
            break
        if optional in shown:
            shown.remove(optional)
            hidden.append(optional)
    table = new_table(title(report))
    if hidden:
        table.caption = (f"{', '.join(hidden)} hidden at {width} columns (--width {full} shows "
                         f"{'them' if len(hidden) > 1 else 'it'})")
        table.caption_justify = "left"
    code_width = max(CODE_MIN, room(shown))
    for c in shown:
        if c == "op":
            table.add_column("code", no_wrap=True, width=code_width)
        table.add_column(ln if c == "ln" else c, no_wrap=True,
                         justify="right" if c in ("#", "ln", "alloc") else "left")
    code = [elide(s.text, code_width) for s in steps]
    _add_steps(table, report, code, [c for c in shown if c not in ("#", "ln", "op", "shape")],
               cells)
    return table


def loops(steps, longest: int = 64) -> dict:
    """Blocks of steps that run again and again (a loop's iterations, a helper called per
    head): {position of the block: (its length, how many times it runs)}, longest cover first."""
    keys = [(s.file, s.line, s.op, s.text, s.shape, s.phase) for s in steps]
    found, i = {}, 0
    while i < len(keys):
        best = (0, 0, 0)  # steps covered, block length, times
        for p in range(1, min(longest, (len(keys) - i) // 2) + 1):
            k = 1
            while keys[i + k * p:i + (k + 1) * p] == keys[i:i + p]:
                k += 1
            if k > 1 and p * k > best[0]:
                best = (p * k, p, k)
        if best[0]:
            found[i] = best[1:]
        i += best[0] or 1
    return found


def _add_steps(table, report: ShapesReport, code: list, extra: list, cells: dict) -> None:
    """One row per step, a section per phase of a decoding run; a block that runs again and
    again is shown once, with how many times it ran."""
    phase, folded, skip = "", loops(report.steps), set()
    for i, (length, times) in folded.items():
        skip.update(range(i + length, i + length * times))
    blank = [""] * (len(table.columns) - 3)
    for i, (s, text) in enumerate(zip(report.steps, code)):
        if i in skip:
            continue
        if s.phase != phase:
            phase = s.phase
            table.add_section()
            table.add_row("", "", Text(phase_label(report, phase), style="bold magenta"), *blank)
        alloc = Text("view", style="green") if s.is_view else Text(cells["alloc"][i], style="yellow")
        row = [cells["#"][i], cells["ln"][i], Text(text), s.op, cells["shape"][i]]
        row += [cells[c][i] for c in extra if c != "alloc"]
        table.add_row(*row, alloc, style="bold" if s.op == "contiguous" and not s.is_view else None)
        start = next((j for j, (n, _) in folded.items() if j + n - 1 == i), None)
        if start is not None:  # whole where it fits, else short: the notes say it whole
            note, width = "↻ " + _loop_note(report.steps, start, *folded[start]), table.columns[2].width
            note = note if len(note) <= width else f"↻ ran ×{folded[start][1]} (see Loops)"
            table.add_row("", "", Text(elide(note, width), style="cyan"), *blank)


def _loop_note(steps, start: int, length: int, times: int) -> str:
    first, last = steps[start].index, steps[start + length - 1].index
    rows = f"row {first}" if length == 1 else f"rows {first}–{last}"
    again = steps[start + length].index, steps[start + length * times - 1].index
    return f"{rows} ran ×{times} (rows {again[0]}–{again[1]} not shown)"


def loop_notes(steps) -> str:
    """'Loops: row 3 ran ×24 (rows 4–26 not shown); ...', or '' when nothing repeats."""
    notes = [_loop_note(steps, start, *block) for start, block in loops(steps).items()]
    return ("Loops: " + "; ".join(notes) + "; --format json keeps every pass.") if notes else ""


def phase_label(report: ShapesReport, phase: str) -> str:
    """'prefill: tokens 0-9' / 'decode step 2: token 11'."""
    T = report.sizes.seq
    if phase == "prefill":
        return f"prefill: tokens 0–{T - 1}"
    step = int(phase.rsplit(" ", 1)[1])
    return f"step {step}: token {T + step - 1}"


def shapes_notes(report: ShapesReport) -> Group:
    """Plain words for students: what view, transpose and contiguous did in this run."""
    steps, r = report.steps, report.sizes
    notes = Table.grid(padding=(0, 2))
    notes.add_column(no_wrap=True)
    notes.add_column()
    for op, words in _LAYOUT.items():  # every change of layout the run made, view or copy
        views = [s for s in steps if s.op == op and s.is_view]
        if views:
            notes.add_row(f"  {op}", f"{_rows(views, op)}: {words}")
        for s in (s for s in steps if s.op == op and not s.is_view):
            notes.add_row(f"  {op}", f"row {s.index}: copied {human_bytes(s.bytes)}: its input was "
                                     "not contiguous, so the new shape could not be read over the "
                                     "same memory (a .view there would fail).")
    for s in steps:
        if s.op == "contiguous" and not s.is_view:
            notes.add_row("  contiguous", f"row {s.index}: copied {human_bytes(s.bytes)} into a "
                                          "fresh row-major block, so that .view can merge heads.")
        elif s.op == "contiguous":
            notes.add_row("  contiguous", f"row {s.index}: already contiguous, so it returned "
                                          "itself (no copy).")
    repeats = [s for s in steps if s.op == "repeat_interleave" and s.inputs]
    if repeats:  # how many copies, read off the run (a module builds its own K/V heads)
        copies = math.prod(repeats[0].shape) // max(math.prod(repeats[0].inputs[0]), 1)
        notes.add_row("  repeat", f"{_rows(steps, 'repeat_interleave')}: each K/V head copied for "
                                  f"{copies} query heads (grouped-query attention).")
    p = report.parameters
    lines = [f"Parameters: {sum(p.values()):,}" + (" (" + " · ".join(f"{k} {v:,}" for k, v in
                                                                    p.items()) + ")" if p else "")]
    new = [s for s in steps if s.bytes]
    verb = "would allocate" if r.device == "meta" else "allocated"
    lines.append(f"Forward pass {verb} {human_bytes(report.bytes_allocated)} in {len(new)} new "
                 "tensors (inputs included).")
    big = report.largest
    lines.append(f"Largest tensor: row {big.index} {big.text} {shape_text(big.shape)}, "
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
    lines += [line for line in (loop_notes(steps), internal_path(steps)) if line]
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
    ins = ", ".join(shape_text(i) for i in f.inputs) or "none"
    where = f"{display_path(f.file)}:{f.line}" if f.line else display_path(f.file)
    lines = [f"forward raised at {where}", f"    {f.source}", f"op: {f.op} ({f.text})",
             f"input shapes: {ins}", f"torch says: {f.message}"]
    if f.hint:
        lines.append(f"hint: {f.hint}")
    return [Text("\n".join(lines), style="bold red")]


def shapes_data(report: ShapesReport) -> dict:
    r = report.sizes
    return {
        "command": "shapes",
        "config": {"batch": r.batch, "seq": r.seq, "d_model": r.d_model, "heads": r.heads,
                   "kv_heads": r.kv_heads or r.heads, "d_k": r.d_model // r.heads,
                   "device": r.device, "dtype": r.dtype, "mask": r.mask, "pad": r.pad,
                   "seed": r.seed, "rope": r.rope, "rope_base": r.rope_base,
                   "window": r.window, "impl": r.impl, "decode": r.decode,
                   **({"rope_dim": r.rope_dim} if r.rope and r.rope_dim else {}), **r.scoring.module_options()},
        "steps": [{"step": s.index, "op": s.op, "text": s.text, "file": display_path(s.file), "line": s.line,
                   "source": s.source, "shape": list(s.shape), "stride": list(s.stride),
                   "contiguous": s.contiguous, "view": s.is_view, "dtype": s.dtype,
                   "bytes": s.bytes, "inputs": [list(i) for i in s.inputs], "phase": s.phase}
                  for s in report.steps],
        "failure": None if not report.failure else {
            "op": report.failure.op, "text": report.failure.text,
            "file": display_path(report.failure.file), "line": report.failure.line,
            "source": report.failure.source, "inputs": [list(i) for i in report.failure.inputs],
            "message": report.failure.message, "hint": report.failure.hint or None},
        "summary": {"parameters": sum(report.parameters.values()),
                    "parameters_by_layer": report.parameters,
                    "bytes_allocated": report.bytes_allocated,
                    "estimated_peak_bytes": report.estimate},
    }


_NOTES = {
    "input": "the tensor as forward receives it",
    "linear": "a learned projection, x·Wᵀ + b",
    "view": "the same memory read with a new shape and strides",
    "reshape": "a new shape; a view when the strides allow it, else a copy",
    "transpose": "two dims swap their strides; nothing moves, so it is not contiguous any more",
    "permute": "dims reordered by swapping strides; nothing moves",
    "contiguous": "copies into a fresh row-major block when the strides are not row-major",
    "matmul": "matrix product over the last two dims, batched over the others",
    "softmax": "softmax over the keys: each query's weights sum to 1",
    "masked_fill": "masked keys set to -inf, so softmax gives them weight 0",
    "repeat_interleave": "each K/V head copied for the query heads that share it (GQA)",
    "scaled_dot_product_attention": "the fused kernel: softmax(QKᵀ/√d_k)·V without the weights",
    "div": "scores divided by √d_k, so their spread does not grow with d_k",
    "mul": "an element-wise product",
    "add": "an element-wise sum",
    "cat": "tensors joined along one dim",
}


def step_note(step) -> str:
    """One step in plain words, for the explorer: what the op does and what it cost here."""
    what = _NOTES.get(step.op, f"the op {step.op}")
    if step.op == "input":
        cost = f"{human_bytes(step.bytes)}"
    elif step.is_view:
        cost = "a view: 0 bytes, no data moved"
    else:
        cost = f"a new tensor of {human_bytes(step.bytes)}"
    return f"{what[0].upper()}{what[1:]}. Here {cost}."


@renderables.register(ShapesReport)
def _shapes(report, width: int, **_) -> list:
    if report.symbols is not None:
        from mha_trace.render.compact import compact_table

        shown = [compact_table(report, report.symbols, width)]
    else:
        table = shapes_table(report, width)
        shown = [table, *failure_renderables(report)] if report.failure else [table, shapes_notes(report)]
    if report.explicit is not None:
        from mha_trace.render.modern import compare_impl_table

        shown += compare_impl_table(report.explicit, report)
    return shown


@data.register(ShapesReport)
def _shapes_data(report, **_) -> dict:
    shown = shapes_data(report)
    if report.symbols is not None:
        from mha_trace.render.compact import compact_rows

        shown["compact"] = [{"row": name, "step": i, "symbols": report.symbols[i]}
                            for name, i in compact_rows(report)]
    if report.explicit is not None:
        shown["compare_impl"] = {"explicit_bytes": report.explicit.bytes_allocated,
                                 f"{report.sizes.impl}_bytes": report.bytes_allocated,
                                 "max_abs_diff": report.max_diff(report.explicit)}
    return shown


import mha_trace.render.page  # noqa: E402,F401 (registers the page of what this file shows)
