"""Render `cost` rows: tables per section, optional formulas, JSON data. No torch here."""

from rich.text import Text

from mha_trace.core.costs import decimal_bytes, human_bytes, si
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables
from mha_trace.core.costs import CostReport


def _count(n: int, unit: str) -> str:
    return f"{n:,}" if unit == "params" else si(n)


def _head(d, layers: int, label: str, source: str | None) -> list:
    m = d.latent
    kinds = f"kv_heads={d.kv_heads} (d_k={d.d_k})" if m is None else (
        f"latent attention (d_c={m.kv_rank}, d_R={m.rope_dim}, d_h={m.nope_dim}, d_v={m.v_dim}"
        + (f", d_c'={m.q_rank})" if m.q_rank else ")"))
    head = Text(f"cost: {label}: batch={d.batch} seq={d.seq} d_model={d.d_model} heads={d.heads} "
                f"{kinds} layers={layers} {d.dtype} ({d.itemsize} bytes) bias={'yes' if d.bias else 'no'}",
                style="bold")
    return [head] + ([Text(f"Source: {source}")] if source else [])


def cost_renderables(rows, d, layers: int, formulas: bool) -> list:
    out = []
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
                          style="bold" if r.item.endswith("total") else None)
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
    out += _notes(d, formulas, layers)
    return out


def _latent_note(d, layers: int) -> str:
    m, H = d.latent, d.heads
    mha = 2 * H * m.nope_dim
    return (f"Multi-head latent attention caches one latent c (d_c = {m.kv_rank}) and one RoPE key (d_R = "
            f"{m.rope_dim}) a token and layer: {m.cached():,} elements a layer, {m.cached() * layers:,} over "
            f"{layers} layers (DeepSeek-V2's Table 1: (d_c + d_R)·l). Were its {H} heads to cache their own K "
            f"and V of d_h = {m.nope_dim}, it would be 2·H·d_h = {mha:,} a layer, {mha / m.cached():.1f}× more; "
            f"it caches as much as grouped-query attention with {m.cached() / (2 * m.nope_dim):g} K/V "
            f"groups. Each head's key and value are made up from c when attention runs (FLOPs above: "
            f"the naive form, as it trains; at inference W^UK can be absorbed into the queries and W^UV "
            f"into W^O).")


def _notes(d, formulas: bool, layers: int = 1) -> list:
    notes = ["Scores are per layer (one layer's T×T tensors are alive at a time); FLOPs count a "
             "multiply-add as 2."] + ([_latent_note(d, layers)] if d.latent else [
             "The tiled row follows FlashAttention-2 (Dao 2023), which keeps one "
             "fp32 logsumexp per query row for the backward pass; FlashAttention-1 (Dao et al. "
             "2022) kept two, the row max and sum (8 bytes a row)."])
    if d.scoring.relative_bias:
        notes.append("T5's relative bias is a table of 32 learned numbers a head, counted here a layer, as the "
                     "lecture module holds it; T5 itself keeps one table, its first layer's, for the whole stack.")
    if d.rope_dim:
        notes.append(f"Partial RoPE: only the first {d.rope_dim} of each head's {d.d_k} dims of q and k turn (Phi's "
                     f"partial_rotary_factor {d.rope_dim / d.d_k:g}); the rest pass through, and no parameter is added.")
    elif d.rope:
        notes.append("RoPE adds no parameters: it turns Q and K by position with cos/sin of fixed "
                     "angles, computed, not learned.")
    if d.cross:
        notes.append(f"Cross-attention: each layer's second attention takes its queries from the "
                     f"{d.seq:,} decoder positions (T) and its keys and values from the {d.cross:,} encoder "
                     f"positions (S): its scores are T×S, not square, and its K and V are computed "
                     f"once from the encoder's output and kept while the decoder writes token by "
                     f"token (a static cache beside the self-attention's growing one).")
    notes += _window_notes(d, layers)
    if not formulas:
        notes.append("--formulas shows every formula with the numbers put in.")
    return [Text(" ".join(notes))]


def _window_notes(d, layers: int) -> list:
    """What a window, its sinks, local and global layers, a head's own width and sink logits do."""
    from mha_trace.core.windows import layer_kinds

    notes = []
    if d.head_dim and d.q_dim != d.d_model:
        notes.append(f"A head is {d.d_k} wide, not d_model / heads = {d.d_model // d.heads}: the queries "
                     f"and the heads' concatenation are H·d_k = {d.q_dim} wide, so W_q and W_o are "
                     f"{d.d_model}×{d.q_dim} and {d.q_dim}×{d.d_model}.")
    if d.window is not None:
        kept = f"the last {d.window} tokens" + (f" and the first {d.sinks} (its sinks, as StreamingLLM "
                                                f"keeps them)" if d.sinks else "")
        n_local, n_global = layer_kinds(d, layers)
        whose = (f"In the {n_local} local layers (of {d.local_global[0]} local to {d.local_global[1]} "
                 f"global a cycle, the first local)" if d.local_global else f"Sliding window {d.window}:")
        notes.append(f"{whose} a query sees at most {d.window} keys{' and the sinks' if d.sinks else ''}, "
                     f"so the KV cache keeps {kept} per layer (a rolling buffer)"
                     + (f"; the {n_global} global layers see and keep every token." if d.local_global else "."))
    if d.sink_logits:
        notes.append("Sink logits: each head learns one logit that joins every softmax row (gpt-oss), "
                     "so a query may give weight to nothing; one parameter a head, nothing cached.")
    elif d.scoring.sinks == "zero":
        notes.append("The off-by-one softmax: a logit fixed at 0 joins every row, exp(s_j) / (1 + Σ exp(s)), so a "
                     "query may give weight to nothing; no parameter, nothing cached.")
    return notes


def io_renderables(io, layers: int, formulas: bool) -> list:
    """`cost --io`: each kernel's bytes to and from main memory, standard then tiled; the totals,
    the tiles and what was published at these dimensions."""
    passes = "forward and backward pass" if io.backward else "forward pass"
    table = new_table(f"Main-memory (HBM) reads and writes of one {passes}")
    for name, justify in (("path", "left"), ("pass", "left"), ("step", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    if formulas:
        table.add_column("formula", overflow="fold")
    table.add_column("one layer", justify="right")
    table.add_column(f"{layers} layer{'s' if layers != 1 else ''}", justify="right")
    for path in ("standard", "tiled"):
        for t in (t for t in io.terms if t.path == path):
            cells = [path, t.pass_, t.step] + ([f"{t.formula} = {t.numbers}"] if formulas else [])
            table.add_row(*cells, decimal_bytes(t.bytes), decimal_bytes(t.bytes * layers))
        total = io.total(path)
        table.add_row(path, "", "total", *([""] if formulas else []), decimal_bytes(total),
                      decimal_bytes(total * layers), style="bold", end_section=True)
    return [table, Text(" ".join(_io_notes(io)))]


def _io_notes(io) -> list:
    standard, tiled = io.total("standard"), io.total("tiled")
    (fq, fk), (bq, bk) = io.tiles.forward, io.tiles.backward
    notes = [f"Standard {decimal_bytes(standard)}, tiled {decimal_bytes(tiled)}: "
             f"{standard / tiled:.1f}× fewer bytes.",
             f"Tiles: forward {fq} query × {fk} key rows"
             + (f", backward {bq} × {bk}" if io.backward and io.tiles.backward != io.tiles.forward else "")
             + f" ({io.tiles.rule}).",
             "Standard attention stores every N×N matrix it makes and reads it back; the tiled pass "
             "keeps its N×N tiles in on-chip SRAM (masks and dropout too) and streams K and V past "
             "each query tile: Θ(N²d²/M) bytes for M of SRAM (Dao et al. 2022, Theorem 2)."]
    if io.skipped:
        kept = tiled - io.skipped
        notes.append(f"Skipping the tiles wholly above the causal diagonal (FlashAttention-2, "
                     f"§3.1.1) moves {decimal_bytes(io.skipped)} fewer: {decimal_bytes(kept)}, "
                     f"{standard / kept:.1f}× fewer than standard.")
    if io.reference:
        notes.append(f"Published: {io.reference}.")
    return notes


def cost_data(rows, d, layers: int, preset: str | None, source: str | None) -> dict:
    return {
        "command": "cost",
        "config": {"preset": preset, "batch": d.batch, "seq": d.seq, "d_model": d.d_model,
                   "heads": d.heads, "kv_heads": d.kv_heads, "d_k": d.d_k, "layers": layers,
                   "dtype": d.dtype, "bytes_per_element": d.itemsize, "bias": d.bias,
                   "rope": d.rope, "rope_dim": d.rope_dim, "window": d.window, "cross_keys": d.cross,
                   "local_global": None if d.local_global is None else list(d.local_global),
                   "sinks": d.sinks, "sink_logits": d.sink_logits,
                   "scores": d.scoring.flags(),  # the scores' variants counted, as flags: ["--qk-norm", ...]
                   "latent": None if d.latent is None else {
                       "kv_lora_rank": d.latent.kv_rank, "q_lora_rank": d.latent.q_rank,
                       "qk_nope_head_dim": d.latent.nope_dim, "qk_rope_head_dim": d.latent.rope_dim,
                       "v_head_dim": d.latent.v_dim, "kv_cache_elements_per_token": d.latent.cached() * layers},
                   "source": source},
        "rows": [{"section": r.section, "item": r.item, "formula": r.formula,
                  "numbers": r.numbers, "per_layer": r.per_layer, "total": r.total,
                  "unit": r.unit} for r in rows],
    }


@renderables.register(CostReport)
def _cost(r, width: int, **_) -> list:
    shown = (io_renderables(r.io, r.layers, r.formulas) if r.io  # the traffic alone
             else cost_renderables(r.rows, r.dims, r.layers, r.formulas))
    return _head(r.dims, r.layers, r.label, r.source) + shown


@data.register(CostReport)
def _cost_data(r, **_) -> dict:
    shown = cost_data(r.rows, r.dims, r.layers, r.preset, r.source)
    if r.io:
        io = r.io
        shown["io"] = {
            "backward": io.backward, "causal": io.causal, "dropout": io.dropout,
            "tiles": {"forward": {"block_q": io.tiles.forward[0], "block_k": io.tiles.forward[1]},
                      "backward": {"block_q": io.tiles.backward[0], "block_k": io.tiles.backward[1]},
                      "rule": io.tiles.rule},
            "terms": [{"path": t.path, "pass": t.pass_, "step": t.step, "formula": t.formula,
                       "numbers": t.numbers, "bytes": t.bytes} for t in io.terms],
            "standard_bytes": io.total("standard"), "tiled_bytes": io.total("tiled"),
            "tiled_bytes_skipping_causal_tiles": io.total("tiled") - io.skipped,
            "published": io.reference}
    return shown
