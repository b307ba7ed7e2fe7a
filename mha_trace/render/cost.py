"""Render `cost` rows: tables per section, optional formulas, JSON data. No torch here."""

from rich.text import Text

from mha_trace.core.costs import decimal_bytes, human_bytes, si
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables
from mha_trace.core.costs import CostReport


def _count(n: int, unit: str) -> str:
    return f"{n:,}" if unit == "params" else si(n)


def cost_renderables(rows, d, layers: int, label: str, source: str | None, formulas: bool) -> list:
    head = Text(f"cost: {label}: batch={d.batch} seq={d.seq} d_model={d.d_model} heads={d.heads} "
                f"kv_heads={d.kv_heads} (d_k={d.d_k}) layers={layers} {d.dtype} "
                f"({d.itemsize} bytes) bias={'yes' if d.bias else 'no'}", style="bold")
    out = [head]
    if source:
        out.append(Text(f"Source: {source}"))
    for section, title, unit in (("parameters", "Parameters", "params"),
                                 ("flops", "FLOPs of one forward pass", "FLOPs")):
        table = new_table(title)
        table.add_column("item")
        if formulas:
            table.add_column("formula", overflow="fold")
        table.add_column("one layer", justify="right")
        table.add_column(f"{layers} layer{'s' if layers != 1 else ''}", justify="right")
        for r in (r for r in rows if r.section == section):
            cells = [r.item]
            if formulas:
                cells.append(f"{r.formula} = {r.numbers}" if r.numbers else r.formula)
            table.add_row(*cells, _count(r.per_layer, unit), _count(r.total, unit),
                          style="bold" if r.item == "attention total" else None)
        out.append(table)
    table = new_table("Memory")
    table.add_column("item")
    if formulas:
        table.add_column("formula", overflow="fold")
    table.add_column("bytes", justify="right")
    table.add_column("decimal", justify="right")
    table.add_column("binary", justify="right")
    for r in (r for r in rows if r.section == "memory"):
        cells = [r.item] + ([f"{r.formula} = {r.numbers}"] if formulas else [])
        table.add_row(*cells, f"{r.total:,}", decimal_bytes(r.total), human_bytes(r.total))
    out.append(table)
    notes = ["Scores are per layer (one layer's T×T tensors are alive at a time); FLOPs count a "
             "multiply-add as 2. The tiled row follows FlashAttention-2 (Dao 2023), which keeps one "
             "fp32 logsumexp per query row for the backward pass; FlashAttention-1 (Dao et al. "
             "2022) kept two, the row max and sum (8 bytes a row)."]
    if d.rope:
        notes.append("RoPE adds no parameters: it turns Q and K by position with cos/sin of fixed "
                     "angles, computed, not learned.")
    if d.window is not None:
        notes.append(f"Sliding window {d.window}: a query sees at most {d.window} keys, so the "
                     f"KV cache keeps the last {d.window} tokens per layer (a rolling buffer).")
    if not formulas:
        notes.append("--formulas shows every formula with the numbers put in.")
    out.append(Text(" ".join(notes)))
    return out


def cost_data(rows, d, layers: int, preset: str | None, source: str | None) -> dict:
    return {
        "command": "cost",
        "config": {"preset": preset, "batch": d.batch, "seq": d.seq, "d_model": d.d_model,
                   "heads": d.heads, "kv_heads": d.kv_heads, "d_k": d.d_k, "layers": layers,
                   "dtype": d.dtype, "bytes_per_element": d.itemsize, "bias": d.bias,
                   "rope": d.rope, "window": d.window, "source": source},
        "rows": [{"section": r.section, "item": r.item, "formula": r.formula,
                  "numbers": r.numbers, "per_layer": r.per_layer, "total": r.total,
                  "unit": r.unit} for r in rows],
    }


@renderables.register(CostReport)
def _cost(r, width: int, **_) -> list:
    return cost_renderables(r.rows, r.dims, r.layers, r.label, r.source, r.formulas)


@data.register(CostReport)
def _cost_data(r, **_) -> dict:
    return cost_data(r.rows, r.dims, r.layers, r.preset, r.source)
