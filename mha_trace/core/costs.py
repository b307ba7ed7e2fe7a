"""What attention costs, from first principles. Plain arithmetic: this module never imports torch.

Symbols: B batch, T sequence length, D d_model, H query heads, G key/value heads (G = H for
multi-head, 1 for multi-query), d_k = D / H, L layers, s bytes per element.
"""

from dataclasses import dataclass, replace
from typing import Any

from mha_trace.core.clashes import needs
from mha_trace.core.presets import load_preset
from mha_trace.core.scoring import Scoring, scoring_of
from mha_trace.core.scoring_costs import scoring_flop_stages, scoring_parameters
from mha_trace.core.windows import band, cached_tokens, layer_kinds, window_options
from mha_trace.core.latent import check_widths, latent_of
from mha_trace.errors import MhaError
from mha_trace.io.units import human_bytes  # noqa: F401 (the unit every byte count is shown in)
from mha_trace.records import Shows

DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Dims:
    batch: int
    seq: int
    d_model: int
    heads: int
    kv_heads: int
    dtype: str = "float32"
    bias: bool = True
    mask: str = "none"  # "none"; "pad": one row of T expanded to (T, T); "full": a (T, T) matrix
    window: int | None = None  # sliding window: a query sees at most this many keys
    rope: bool = False  # rotary positions (no parameters)
    rope_dim: int | None = None  # partial RoPE: the first rope_dim of each head's dims turn (None: all)
    cross: int | None = None  # a decoder's cross-attention: the encoder positions its queries see
    latent: object = None  # core.latent.Latent: multi-head latent attention (DeepSeek's), or None
    head_dim: int | None = None  # d_k when it is not d_model / heads (Gemma 2, gpt-oss)
    local_global: tuple | None = None  # (local, global) layers a cycle: the local ones windowed
    sinks: int = 0  # StreamingLLM: the first S tokens, kept beside the window (cache and scores)
    sink_logits: bool = False  # gpt-oss: a learned logit a head joins every softmax row
    scoring: Scoring = Scoring()  # QK-norm, ALiBi, a soft cap, differential attention (core.scoring)

    @property
    def d_k(self) -> int:
        return self.head_dim or self.d_model // self.heads

    @property
    def q_dim(self) -> int:
        """H·d_k: the width of the queries and of the heads' concatenation (D unless head_dim)."""
        return self.heads * self.d_k

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.d_k

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]


def parameters(d: Dims) -> dict:
    """Parameter count of each projection: weights D×(H·d_k) for Q and O (D×D when d_k = D/H),
    D×(G·d_k) for K and V; with sink logits, one a head."""
    b = 1 if d.bias else 0
    return {
        "W_q": d.d_model * d.q_dim + b * d.q_dim,
        "W_k": d.d_model * d.kv_dim + b * d.kv_dim,
        "W_v": d.d_model * d.kv_dim + b * d.kv_dim,
        "W_o": d.q_dim * d.d_model + b * d.d_model,
        **({"sink logits": d.heads} if d.sink_logits else {}),
        **{item: value for item, (_, _, value) in scoring_parameters(d).items()},
    }


def forward_bytes(d: Dims) -> dict:
    """Bytes newly allocated by one eager forward pass of attention.MultiHeadAttention.

    Nothing is assumed freed, so the total is an upper bound on the peak; it equals what the
    traced run reports. Views allocate nothing.
    """
    B, T, D, H, s = d.batch, d.seq, d.d_model, d.heads, d.itemsize
    btd, bht2 = B * T * D * s, B * H * T * T * s
    masked = d.mask != "none"
    # merging heads copies only when (B, T, H, d_k) is not already row-major: H > 1 and T > 1
    merge_copies = 1 if H > 1 and T > 1 else 0
    parts = {
        "input": btd,
        "projections": btd + 2 * B * T * d.kv_dim * s,  # W_q(q), W_k(k), W_v(v)
        "kv repeat": 2 * btd if d.kv_heads != d.heads else 0,  # K, V expanded to H heads
        "scores": bht2 * (3 + (2 if masked else 0)),  # QK^T, / sqrt(d_k), [masked_fill], softmax, [zero]
        # the bool mask (a padding row is stored once: T bytes) and its two negations, 1 byte each
        "mask": (T if d.mask == "pad" else T * T) + 2 * T * T if masked else 0,
        "context": (2 + merge_copies) * btd,  # weights @ V, [contiguous copy], W_o
    }
    return parts


def peak_bytes(d: Dims) -> int:
    """Parameters plus everything the forward pass allocates."""
    return sum(parameters(d).values()) * d.itemsize + sum(forward_bytes(d).values())


# ---- the `cost` command: every figure with the formula that gives it ----

@dataclass(frozen=True)
class Row:
    section: str  # "parameters" | "flops" | "memory"
    item: str
    formula: str  # symbolic
    numbers: str  # the formula with the numbers put in
    per_layer: int
    total: int  # all layers (for the KV cache: the whole cache)
    unit: str  # "params" | "FLOPs" | "bytes"


def cost_rows(d: Dims, layers: int) -> list[Row]:
    """Parameters, FLOPs per stage, score memory and KV cache of one attention layer and of all.

    FLOPs count a multiply-add as 2. Softmax counts 5 per score (max, subtract, exp, sum, divide)
    and the ÷√d_k scaling 1; bias additions count 1 per output element.
    """
    rows = []

    def add(section, item, formula, numbers, value, unit, total=None):
        rows.append(Row(section, item, formula, numbers, value,
                        value * layers if total is None else total, unit))

    if d.latent is not None:
        from mha_trace.core.latent import latent_rows

        latent_rows(add, d, layers)
        return rows
    for section in (_parameter_rows, _flop_rows, _memory_rows):
        section(add, d, layers)
    if d.cross:
        _cross_rows(add, d, layers, d.cross)
    return rows


def _cross_rows(add, d: Dims, L: int, S: int) -> None:
    """A decoder layer's second attention: queries from the T text positions, keys and values
    from the S encoder positions (computed once per input and kept while the decoder writes)."""
    B, T, D, H, G, k, s = d.batch, d.seq, d.d_model, d.heads, d.kv_heads, d.d_k, d.itemsize
    b, gk = (1 if d.bias else 0), G * k
    p = parameters(d)
    for name in p:
        add("parameters", f"cross {name}", "as the self-attention's", "", p[name], "params")
    add("parameters", "cross-attention total", "sum of the cross rows", "", sum(p.values()), "params")
    add("parameters", "self + cross total", "both attentions", "", 2 * sum(p.values()), "params")
    stages = [("cross Q projection", "2·B·T·D·D" + " + B·T·D" * b, f"2·{B}·{T}·{D}·{D}" + f" + {B}·{T}·{D}" * b,
               2 * B * T * D * D + b * B * T * D),
              ("cross K, V projections (once)", "2·(2·B·S·D·G·d_k)" + " + 2·B·S·G·d_k" * b,
               f"2·(2·{B}·{S}·{D}·{gk})" + f" + 2·{B}·{S}·{gk}" * b, 4 * B * S * D * gk + b * 2 * B * S * gk),
              ("cross scores QKᵀ", "2·B·H·T·S·d_k", f"2·{B}·{H}·{T}·{S}·{k}", 2 * B * H * T * S * k),
              ("cross scale ÷√d_k", "B·H·T·S", f"{B}·{H}·{T}·{S}", B * H * T * S),
              ("cross softmax", "5·B·H·T·S", f"5·{B}·{H}·{T}·{S}", 5 * B * H * T * S),
              ("cross weights · V", "2·B·H·T·S·d_k", f"2·{B}·{H}·{T}·{S}·{k}", 2 * B * H * T * S * k),
              ("cross output projection", "2·B·T·D·D" + " + B·T·D" * b, f"2·{B}·{T}·{D}·{D}" + f" + {B}·{T}·{D}" * b,
               2 * B * T * D * D + b * B * T * D)]
    for item, formula, numbers, value in stages:
        add("flops", item, formula, numbers, value, "FLOPs")
    cross = sum(stage[3] for stage in stages)
    add("flops", "cross-attention total", "sum of the cross rows", "", cross, "FLOPs")
    add("flops", "self + cross total", "both attentions", "", cross + flops(d), "FLOPs")
    once = lambda item, formula, numbers, value: add("memory", item, formula, numbers, value, "bytes",
                                                     total=value)
    once("cross scores, materialised", "B·H·T·S·s", f"{B}·{H}·{T}·{S}·{s}", B * H * T * S * s)
    once("cross K/V (static cache), one layer", "2·G·d_k·s·B·S", f"2·{G}·{k}·{s}·{B}·{S}", 2 * gk * s * B * S)
    once("cross K/V (static cache), all layers", "2·G·d_k·s·L·B·S", f"2·{G}·{k}·{s}·{L}·{B}·{S}",
         2 * gk * s * L * B * S)


def _parameter_rows(add, d: Dims, L: int) -> None:
    D, G, k, b = d.d_model, d.kv_heads, d.d_k, 1 if d.bias else 0
    kv_bias, gk = (" + G·d_k", G * k) if b else ("", G * k)
    Q, QN = _q_width(d)
    p = parameters(d)
    add("parameters", "W_q", f"D·{Q}{f' + {Q}' if b else ''}",
        f"{D}·{QN}{f' + {d.q_dim}' if b else ''}", p["W_q"], "params")
    add("parameters", "W_k", f"D·G·d_k{kv_bias}", f"{D}·{G}·{k}{f' + {gk}' if b else ''}", p["W_k"], "params")
    add("parameters", "W_v", f"D·G·d_k{kv_bias}", f"{D}·{G}·{k}{f' + {gk}' if b else ''}", p["W_v"], "params")
    add("parameters", "W_o", f"{Q}·D{' + D' if b else ''}", f"{QN}·{D}{f' + {D}' if b else ''}", p["W_o"], "params")
    if d.sink_logits:
        add("parameters", "sink logits", "H", f"{d.heads}", p["sink logits"], "params")
    for item, (formula, numbers, value) in scoring_parameters(d).items():
        add("parameters", item, formula, numbers, value, "params")
    add("parameters", "attention total", "sum of the above", "", sum(p.values()), "params")


def _q_width(d: Dims) -> tuple[str, str]:
    """The queries' width in symbols and in numbers: D, or H·d_k where a head is not D/H wide."""
    if d.q_dim == d.d_model:
        return "D", f"{d.d_model}"
    return "H·d_k", f"{d.heads}·{d.d_k}"


def flops(d: Dims) -> int:
    """One forward pass's floating-point operations (the cost table's "attention total")."""
    return sum(stage[3] for stage in _flop_stages(d))


def _flop_rows(add, d: Dims, L: int) -> None:
    """One layer's stages and all layers'; with local and global layers, the stages of a global
    layer (every key) and their totals over both kinds, then a local layer's total."""
    if d.local_global is None:
        stages = _flop_stages(d)
        for item, formula, numbers, value in stages:
            add("flops", item, formula, numbers, value, "FLOPs")
        add("flops", "attention total", "sum of the above", "", sum(s[3] for s in stages), "FLOPs")
        return
    n_local, n_global = layer_kinds(d, L)
    stages, local = _flop_stages(replace(d, window=None, sinks=0)), _flop_stages(d)
    for (item, formula, numbers, value), lv in zip(stages, local):
        add("flops", item, formula, numbers, value, "FLOPs", total=value * n_global + lv[3] * n_local)
    one_local = sum(s[3] for s in local)
    add("flops", f"a local layer's total (window {d.window})", "its stages, the window's band", "",
        one_local, "FLOPs", total=one_local * n_local)
    add("flops", "attention total", f"{n_global} global + {n_local} local layers", "",
        sum(s[3] for s in stages), "FLOPs", total=sum(s[3] for s in stages) * n_global + one_local * n_local)


def _pairs(d: Dims) -> tuple[str, str, int]:
    """(formula, numbers, count) of the query-key pairs scored per batch and head: T·T, or the
    sliding window's band (and its sinks)."""
    T = d.seq
    if d.window is None:
        return "T·T", f"{T}·{T}", T * T
    sinks = " + Σᵢ min(S, i+1−W)" if d.sinks else ""
    return f"Σᵢ min(i+1, W){sinks}", f"{band(T, d.window, d.sinks)}", band(T, d.window, d.sinks)


def _flop_stages(d: Dims) -> list:
    """(item, formula, the formula with numbers, FLOPs) per stage of one forward pass; with a
    sliding window the scores, softmax and weights · V count its band only."""
    B, T, D, H, k, b = d.batch, d.seq, d.d_model, d.heads, d.d_k, 1 if d.bias else 0
    gk, q, (Q, QN) = d.kv_heads * k, d.q_dim, _q_width(d)
    pb, kvb = (" + B·T·D", " + 2·B·T·G·d_k") if b else ("", "")
    pf, pn, P = _pairs(d)
    stages = [
        ("Q projection", f"2·B·T·D·{Q}" + (f" + B·T·{Q}" if b else ""),
         f"2·{B}·{T}·{D}·{QN}" + (f" + {B}·{T}·{QN}" if b else ""), 2 * B * T * D * q + b * B * T * q),
        ("K, V projections", f"2·(2·B·T·D·G·d_k){kvb}",
         f"2·(2·{B}·{T}·{D}·{gk})" + (f" + 2·{B}·{T}·{gk}" if b else ""),
         2 * (2 * B * T * D * gk) + b * 2 * B * T * gk),
        ("scores QKᵀ", f"2·B·H·{pf}·d_k", f"2·{B}·{H}·{pn}·{k}", 2 * B * H * P * k),
        ("scale ÷√d_k", f"B·H·{pf}", f"{B}·{H}·{pn}", B * H * P),
        ("softmax", f"5·B·H·{pf}", f"5·{B}·{H}·{pn}", 5 * B * H * P),
        ("weights · V", f"2·B·H·{pf}·d_k", f"2·{B}·{H}·{pn}·{k}", 2 * B * H * P * k),
        ("output projection", f"2·B·T·{Q}·D{pb}", f"2·{B}·{T}·{QN}·{D}" + (f" + {B}·{T}·{D}" if b else ""),
         2 * B * T * q * D + b * B * T * D)]
    if d.sink_logits or d.scoring.sinks == "zero":  # one more logit in each row's softmax (learned, or 0)
        item = "softmax's sink logit" if d.sink_logits else "softmax's 0 logit (off-by-one)"
        stages.insert(5, (item, "5·B·H·T", f"5·{B}·{H}·{T}", 5 * B * H * T))
    normed, scored, mixed = scoring_flop_stages(d, (pf, pn, P))
    R = d.rope_dim or k  # RoPE: x·cos + rotate_half(x)·sin, two products and a sum an element it turns
    turned = [("RoPE (q and k turned)", "3·B·T·(H + G)·" + ("R" if d.rope_dim else "d_k"),
               f"3·{B}·{T}·({H} + {d.kv_heads})·{R}", 3 * B * T * (H + d.kv_heads) * R)] if d.rope else []
    return stages[:2] + normed + turned + stages[2:4] + scored + stages[4:-2] + mixed + stages[-2:]


def _memory_rows(add, d: Dims, L: int) -> None:
    B, T, H, G, k, s = d.batch, d.seq, d.heads, d.kv_heads, d.d_k, d.itemsize
    once = lambda item, formula, numbers, value: add("memory", item, formula, numbers, value,
                                                     "bytes", total=value)
    maps = 2 if d.scoring.diff else 1  # differential attention makes two maps
    once("scores, materialised" + " (two maps)" * (maps == 2), f"{'2·' * (maps == 2)}B·H·T·T·s",
         f"{'2·' * (maps == 2)}{B}·{H}·{T}·{T}·{s}", maps * B * H * T * T * s)
    if d.window is not None:
        pf, pn, P = _pairs(d)
        once(f"scores, sliding window {d.window} (band only)", f"B·H·({pf})·s" if d.sinks else f"B·H·{pf}·s",
             f"{B}·{H}·{pn}·{s}", B * H * P * s)
    once("scores, tiled (FlashAttention-2)", "B·H·T·4 (one fp32 logsumexp per row)",
         f"{B}·{H}·{T}·4", B * H * T * 4)
    once("KV cache per token, one layer", "2·G·d_k·s", f"2·{G}·{k}·{s}", 2 * G * k * s)
    once("KV cache per token, all layers", "2·G·d_k·s·L", f"2·{G}·{k}·{s}·{L}", 2 * G * k * s * L)
    item, cached, numbers, tokens = cached_tokens(d, L)  # token-layers the whole cache holds
    once(item, f"2·G·d_k·s·{cached}", f"2·{G}·{k}·{s}·{numbers}", 2 * G * k * s * tokens)
    if G != H:
        once(f"KV cache saved vs {H} K/V heads", f"2·(H − G)·d_k·s·{cached}",
             f"2·({H} − {G})·{k}·{s}·{numbers}", 2 * (H - G) * k * s * tokens)


def kv_cache_bytes(d: Dims, layers: int, tokens: int) -> int:
    """2·G·d_k·s·L·B·tokens: keys and values of every K/V head, layer and sequence."""
    return 2 * d.kv_heads * d.d_k * d.itemsize * layers * d.batch * tokens


def decimal_bytes(n: float) -> str:
    """1e9 -> '1.00 GB' (powers of 1000)."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if abs(n) < 1000 or unit == "PB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError


def si(n: float) -> str:
    """3.62e12 -> '3.62 T'."""
    for unit in ("", "K", "M", "G", "T", "P", "E"):
        if abs(n) < 1000 or unit == "E":
            return f"{n:.0f}" if unit == "" else f"{n:.2f} {unit}"
        n /= 1000
    raise AssertionError


@dataclass
class CostReport(Shows):
    """What `mha-trace cost` prints: every row at these dimensions, over `layers` layers."""

    rows: list
    dims: Dims
    layers: int
    label: str  # the preset's name, or "custom"
    preset: str | None = None
    source: str | None = None  # where the preset's dimensions were published
    formulas: bool = False  # show each formula with the numbers put in
    io: object = None  # core.hbm.Io: main-memory traffic (`--io`), or None


IO_RULES = tuple(needs(name, "io", "counts main-memory traffic")  # cost's options that --io reads
                 for name in ("backward", "sram", "block_q", "block_k", "causal", "dropout"))


def cost_report(preset: str | None = None, batch: int | None = None, seq: int | None = None,
                d_model: int | None = None, heads: int | None = None, kv_heads: int | None = None,
                layers: int | None = None, dtype: str = "float32", bias: bool | None = None,
                window: int | None = None, rope: bool | None = None,
                formulas: bool = False, io: bool = False, backward: bool = False,
                sram: int | None = None, block_q: int | None = None, block_k: int | None = None,
                causal: bool | None = None, dropout: float | None = None,
                cross: int | None = None, head_dim: int | None = None,
                local_global: str | tuple | None = None, sinks: int | None = None,
                sink_logits: bool | None = None, qk_norm: bool = False, alibi: bool = False,
                softcap: float | None = None, diff: bool = False, relative_bias: bool = False,
                latent: int | None = None, rope_dim: int | None = None, off_by_one: bool = False) -> CostReport:
    """The cost of attention at a preset's dimensions (gpt3-175b, ...), any of them overridden;
    without a preset: batch 2, seq 10, d_model 512, heads 8, one layer. With `io`, the bytes
    standard and tiled attention move to and from main memory (`backward` adds that pass)."""
    from mha_trace.core.clashes import judge
    from mha_trace.core.validate import check_sizes, positive, rope_part

    given = {"batch": batch, "seq": seq, "d_model": d_model, "heads": heads,
             "kv_heads": kv_heads, "layers": layers, "window": window, "cross_keys": cross}
    for name, value in given.items():
        if value is not None and type(value) is not int:
            raise MhaError(f"{name} must be a whole number, got {value!r}", quantity=name)
    p = load_preset(preset) if preset else {}
    def pick(given: Any, key: str, default: Any) -> Any:  # an option given, else the preset's
        return given if given is not None else p.get(key, default)

    batch, seq = pick(batch, "batch", 1 if preset else 2), pick(seq, "seq", 10)
    d_model, heads = pick(d_model, "d_model", 512), pick(heads, "heads", 8)
    layers, kv_heads = pick(layers, "layers", 1), pick(kv_heads, "kv_heads", heads)
    dtype = getattr(dtype, "value", dtype)
    if dtype not in DTYPE_BYTES:
        raise MhaError(f"dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}",
                       quantity="dtype")
    positive("layers", layers)
    check_sizes(batch, seq, d_model, heads, kv_heads)
    window = pick(window, "window", None)
    if window is not None:
        positive("window", window)
    cross = pick(cross, "cross_keys", None) or None  # 0: no cross-attention (a preset's encoder)
    if cross is not None:
        positive("cross_keys", cross)
    rope, d_k = pick(rope, "rope", False), head_dim or p.get("head_dim") or d_model // heads
    partial = rope_dim if rope and latent is None and p.get("attention") != "mla" else None  # Phi's partial RoPE
    if partial is not None:
        check_widths(None, partial)
        rope_part(partial, d_k)
    d = Dims(batch, seq, d_model, heads, kv_heads, dtype, bias=pick(bias, "bias", True),
             window=window, rope=rope, rope_dim=partial, cross=cross,
             latent=latent_of(p, io, window, latent, None if partial else rope_dim, d_k),
             **window_options(pick, head_dim, local_global, sinks, sink_logits, window),
             scoring=scoring_of(qk_norm, softcap, bool(pick(sink_logits, "sink_logits", False)), off_by_one, None,
                                alibi, diff, window, relative_bias=relative_bias))
    label = p.get("name", "custom") if preset else "custom"
    judge({"io": io, "backward": backward, "sram": sram, "block_q": block_q, "block_k": block_k,
           "causal": causal, "dropout": dropout}, IO_RULES)
    traffic = None
    if io:
        from mha_trace.core.hbm import io as count

        traffic = count(batch, heads, seq, d.d_k, d.itemsize, backward, sram, block_q, block_k,
                        pick(causal, "causal", False), pick(dropout, "dropout", 0.0),
                        p.get("io_reference"))
    return CostReport(cost_rows(d, layers), d, layers, label, preset, p.get("source"), formulas,
                      traffic)
