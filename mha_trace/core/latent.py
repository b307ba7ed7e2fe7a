"""What multi-head latent attention costs (MLA: DeepSeek-V2, DeepSeek-AI 2024, §2.1), from first
principles, without torch. Keys and values are not cached per head: each token's hidden state is
projected down to one latent c of d_c dims (and one RoPE key of d_R dims shared by the heads), and
only those are cached; each head's key and value are projected up from c when attention needs them.
Queries may go through a latent of their own (d_c'). Symbols as costs.py's, and d_h each head's
query/key dims without position, d_v its value dims.
"""

from dataclasses import dataclass, replace

from mha_trace.core.clashes import apart, judge, needs
from mha_trace.errors import MhaError

LATENT_RULES = (apart("latent", ("kv_heads", "window", "decode", "impl=sdpa", "impl=tiled", "rope", "qk_norm", "alibi",
                                 "relative_bias", "softcap", "sink_logits", "off_by_one", "diff"),
                      "the lecture's MLA module is DeepSeek-V2's, explicit, its RoPE part always turned"),
                apart("rope_dim", ("diff",), "differential attention turns each half of a head whole"),
                needs("absorbed", "latent", "computes MLA the inference way"))


def check_latent(o) -> None:
    """MLA's and partial RoPE's options (a RunOptions'): the latent and the RoPE part each a positive
    even width."""
    judge({"latent": o.latent, "rope_dim": o.rope_dim, "absorbed": o.absorbed, "rope": o.rope,
           "kv_heads": o.kv_heads, "window": o.window, "decode": o.decode or None,
           "impl=sdpa": getattr(o.impl, "value", o.impl) == "sdpa", "impl=tiled": getattr(o.impl, "value", o.impl) == "tiled",
           "qk_norm": o.qk_norm, "alibi": o.alibi, "relative_bias": o.relative_bias, "softcap": o.softcap,
           "sink_logits": o.sink_logits, "off_by_one": o.off_by_one, "diff": o.diff}, LATENT_RULES)
    if o.rope_dim is not None and not (o.rope or o.latent is not None):
        raise MhaError("--rope-dim sets how many of each head's dims RoPE turns: add --rope (partial RoPE, Phi's) "
                       "or --latent (MLA's decoupled RoPE key)", quantity="rope_dim")
    check_widths(o.latent, o.rope_dim)


def check_widths(kv_rank, rope_dim) -> None:
    """A latent of at least 2 dims, a RoPE part of an even number (RoPE turns pairs); None: not given."""
    for name, value in (("latent", kv_rank), ("rope_dim", rope_dim)):
        if value is not None and (type(value) is not int or value < 2 or value % 2 and name == "rope_dim"):
            raise MhaError(f"{name} {value!r} must be {'an even number of dims (RoPE turns pairs)' if name == 'rope_dim' else 'at least 2'}",
                           quantity=name)


@dataclass(frozen=True)
class Latent:
    kv_rank: int  # d_c: the latent each token's keys and values are made from (cached)
    rope_dim: int  # d_R: the decoupled RoPE key, one per token, shared by the heads (cached)
    nope_dim: int  # d_h: a head's query and key dims without position
    v_dim: int  # d_v: a head's value dims
    q_rank: int | None = None  # d_c': the queries' own latent (None: projected straight from D)

    @classmethod
    def of(cls, preset: dict):
        """From a preset's keys, named as DeepSeek's configs name them."""
        return cls(preset["kv_lora_rank"], preset["qk_rope_head_dim"], preset["qk_nope_head_dim"],
                   preset["v_head_dim"], preset.get("q_lora_rank"))

    def cached(self) -> int:
        """Elements cached per token and layer: d_c + d_R (DeepSeek-V2's Table 1)."""
        return self.kv_rank + self.rope_dim


def latent_of(preset: dict, io: bool, window, kv_rank: int | None = None, rope_dim: int | None = None,
            d_k: int = 0) -> object:
    """Multi-head latent attention, or None: a preset's (attention = "mla"; --latent and --rope-dim
    override its d_c and d_R), or --latent D_C's at the lecture module's sizes (d_h = d_v = d_k, d_R
    default d_k / 2). --io and --window count the attention of heads that cache their own K and V,
    so they are refused for it."""
    if preset.get("attention") != "mla" and kv_rank is None:
        if rope_dim is not None:
            raise MhaError("--rope-dim sizes MLA's decoupled RoPE key: add --latent D_C (or an MLA preset such as "
                           "deepseek-v2); with --rope, the dims each head turns (partial RoPE)", quantity="rope_dim")
        return None
    check_widths(kv_rank, rope_dim)
    if io or window is not None:
        raise MhaError(f"{'--io' if io else '--window'} counts attention whose heads cache their own K and V; "
                       f"{preset.get('name', '--latent')} caches one latent a token (multi-head latent attention)",
                       quantity="io" if io else "window")
    if preset.get("attention") == "mla":
        m = Latent.of(preset)
        return replace(m, kv_rank=kv_rank or m.kv_rank, rope_dim=rope_dim or m.rope_dim)
    return Latent(kv_rank, rope_dim or d_k // 2, d_k, d_k)


def latent_rows(add, d, L: int) -> None:
    """Parameters, FLOPs (the naive form, as it trains) and memory of one MLA layer and of all."""
    _latent_parameters(add, d)
    _latent_flops(add, d)
    _latent_memory(add, d, L)


def latent_parameters(d) -> dict:
    """Each projection's (formula, numbers, parameters), the RMSNorm on each latent included, as
    DeepSeek's layers hold it."""
    m, D, H = d.latent, d.d_model, d.heads
    qh, kv = m.nope_dim + m.rope_dim, m.nope_dim + m.v_dim
    queries = {"W^DQ (queries down to d_c')": ("D·d_c'", f"{D}·{m.q_rank}", D * m.q_rank),
               "norm of the queries' latent": ("d_c'", f"{m.q_rank}", m.q_rank),
               "W^UQ, W^QR (each head's query up, with its RoPE part)": (
                   "d_c'·H·(d_h + d_R)", f"{m.q_rank}·{H}·{qh}", m.q_rank * H * qh)} if m.q_rank else {
        "W^Q, W^QR (each head's query, with its RoPE part)": ("D·H·(d_h + d_R)", f"{D}·{H}·{qh}", D * H * qh)}
    return queries | {
        "W^DKV, W^KR (down to the latent c, and the shared RoPE key)": ("D·(d_c + d_R)", f"{D}·{m.cached()}",
                                                                        D * m.cached()),
        "norm of the latent c": ("d_c", f"{m.kv_rank}", m.kv_rank),
        "W^UK, W^UV (each head's key and value up from c)": ("d_c·H·(d_h + d_v)", f"{m.kv_rank}·{H}·{kv}",
                                                             m.kv_rank * H * kv),
        "W^O": ("H·d_v·D", f"{H}·{m.v_dim}·{D}", H * m.v_dim * D)}


def _latent_parameters(add, d) -> None:
    p = latent_parameters(d)
    for item, (formula, numbers, value) in p.items():
        add("parameters", item, formula, numbers, value, "params")
    add("parameters", "attention total", "sum of the above", "", sum(v for _, _, v in p.values()), "params")


def latent_flop_stages(d) -> list:
    """(item, formula, numbers, FLOPs) of one forward pass, keys and values made up from c."""
    m, B, T, D, H = d.latent, d.batch, d.seq, d.d_model, d.heads
    q_in, qh, c = (m.q_rank or D), m.nope_dim + m.rope_dim, m.kv_rank
    stages = [("Q down to d_c'", "2·B·T·D·d_c'", f"2·{B}·{T}·{D}·{q_in}", 2 * B * T * D * q_in)] if m.q_rank else []
    return stages + [
        ("Q up (d_h + d_R a head)", "2·B·T·d_c'·H·(d_h + d_R)", f"2·{B}·{T}·{q_in}·{H}·{qh}", 2 * B * T * q_in * H * qh),
        ("down to c and the RoPE key", "2·B·T·D·(d_c + d_R)", f"2·{B}·{T}·{D}·{m.cached()}", 2 * B * T * D * m.cached()),
        ("K, V up from c", "2·B·T·d_c·H·(d_h + d_v)", f"2·{B}·{T}·{c}·{H}·{m.nope_dim + m.v_dim}",
         2 * B * T * c * H * (m.nope_dim + m.v_dim)),
        ("scores QKᵀ (d_h + d_R a head)", "2·B·H·T·T·(d_h + d_R)", f"2·{B}·{H}·{T}·{T}·{qh}", 2 * B * H * T * T * qh),
        ("scale ÷√(d_h + d_R)", "B·H·T·T", f"{B}·{H}·{T}·{T}", B * H * T * T),
        ("softmax", "5·B·H·T·T", f"5·{B}·{H}·{T}·{T}", 5 * B * H * T * T),
        ("weights · V", "2·B·H·T·T·d_v", f"2·{B}·{H}·{T}·{T}·{m.v_dim}", 2 * B * H * T * T * m.v_dim),
        ("output projection", "2·B·T·H·d_v·D", f"2·{B}·{T}·{H}·{m.v_dim}·{D}", 2 * B * T * H * m.v_dim * D)]


def _latent_flops(add, d) -> None:
    stages = latent_flop_stages(d)
    for item, formula, numbers, value in stages:
        add("flops", item, formula, numbers, value, "FLOPs")
    add("flops", "attention total", "sum of the above", "", sum(s[3] for s in stages), "FLOPs")


def _latent_memory(add, d, L: int) -> None:
    m, B, T, H, s = d.latent, d.batch, d.seq, d.heads, d.itemsize
    once = lambda item, formula, numbers, value: add("memory", item, formula, numbers, value, "bytes", total=value)
    once("scores, materialised", "B·H·T·T·s", f"{B}·{H}·{T}·{T}·{s}", B * H * T * T * s)
    once("KV cache per token, one layer (c and the RoPE key)", "(d_c + d_R)·s", f"({m.kv_rank} + {m.rope_dim})·{s}",
         m.cached() * s)
    once("KV cache per token, all layers", "(d_c + d_R)·s·L", f"{m.cached()}·{s}·{L}", m.cached() * s * L)
    once("KV cache, batch × seq × layers", "(d_c + d_R)·s·L·B·T", f"{m.cached()}·{s}·{L}·{B}·{T}",
         m.cached() * s * L * B * T)
    once(f"per token, all layers, were each of the {H} heads to cache its K and V", "2·H·d_h·s·L",
         f"2·{H}·{m.nope_dim}·{s}·{L}", 2 * H * m.nope_dim * s * L)
