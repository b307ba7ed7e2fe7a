"""The attention modern models run, in words beside the shapes table: RoPE, the sliding window,
the fused and the tiled path, the KV cache; and the explicit path against the fused or tiled one."""

from rich.text import Text

from mha_trace.analyses.shapes import ShapesReport
from mha_trace.core.costs import DTYPE_BYTES, human_bytes
from mha_trace.io.output import new_table
from mha_trace.io.units import shape_text


def modern_notes(report: ShapesReport) -> list[str]:
    """RoPE, the sliding window, the fused path and the KV cache, in plain words."""
    r, lines = report.sizes, []
    if r.rope and r.rope_dim:
        d_k = r.d_model // r.heads
        lines.append(f"Partial RoPE (Phi's): the first {r.rope_dim} of each head's {d_k} dims of Q and K are turned "
                     f"pair by pair (dims i and i + {r.rope_dim // 2}) by position · {r.rope_base:g}^(-2i/{r.rope_dim}); "
                     f"the other {d_k - r.rope_dim} pass through unturned, so part of every score ignores position.")
    elif r.rope:
        lines.append(f"RoPE: Q and K of each head are turned pair by pair (dims i and i + d_k/2, "
                     f"the rotate-half pairing of LLaMA) by position · {r.rope_base:g}^(-2i/d_k); "
                     f"V is not turned, and no parameter is added.")
    if r.window is not None:
        lines.append(f"Sliding window: query i sees keys i - {r.window - 1} .. i (at most "
                     f"{r.window}, itself included); the band is built inside forward.")
    lines += scoring_notes(report) + latent_notes(report)
    if r.impl == "sdpa":
        saved = report.fused_savings
        lines.append(f"Fused path: F.scaled_dot_product_attention never forms the "
                     f"[{r.batch}, {r.heads}, {report.query_len}, {report.key_len}] scores or "
                     f"weights; the explicit path allocates {human_bytes(saved)} for them "
                     f"(QKᵀ, ÷√d_k, softmax{', the two masked_fills' if report.run.mask is not None else ''}).")
    if r.impl == "tiled":
        lines.append(_tiled_note(report))
    if r.cross:
        kv = 2 * r.batch * r.cross * r.d_model * DTYPE_BYTES[r.dtype]
        lines.append(f"Cross-attention: the queries come from the text, the keys and values from the "
                     f"{r.cross:,} encoder frames (T_q ≠ T_k). They are projected once, at the prefill, "
                     f"into a StaticKVCache ({human_bytes(kv)} for K and V); each later step hands no "
                     f"new frames (k and v of length 0) and reads them back, copying nothing.")
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


def latent_notes(report: ShapesReport) -> list[str]:
    """Multi-head latent attention in words: what a cache keeps, against MHA's; the absorbed form."""
    r, m = report.sizes, report.run.module
    if r.latent is None:
        return []
    kept, mha = m.kv_rank + m.rope_dim, 2 * r.heads * (r.d_model // r.heads)
    lines = [f"Latent attention (DeepSeek-V2's MLA): each token goes down to a latent c of {m.kv_rank} dims "
             f"(normed) and one RoPE key of {m.rope_dim} that every head shares; each head's key and value come "
             f"up from c. A cache keeps c and the RoPE key: {kept} numbers a token and layer, against "
             f"{mha} (2·H·d_k) for the same heads' keys and values ({mha / kept:.1f}× fewer). A score is "
             f"q_C·k_C + q_R·k_R over √(d_h + d_R) = √{m.nope_dim + m.rope_dim}."]
    if r.absorbed:
        lines.append("Absorbed (the inference form): W_UK folded into each head's query (the first einsum) "
                     "scores it against c itself, and the weights mix the latents before W_UV brings each "
                     "head's mix up (the second): no head's key or value is ever formed. The numbers are "
                     "the naive form's (verify --latent checks it).")
    return lines


def scoring_notes(report: ShapesReport) -> list[str]:
    """QK-norm, soft-capping and the sinks, in plain words, with the rows that do them."""
    r, lines = report.sizes, []
    first = [s for s in report.steps if s.phase == report.steps[0].phase]  # decoding: the prefill's
    rows = lambda op, word="": (lambda found: f"{op} at row{'s' * (len(found) > 1)} {', '.join(found)}")(
        [str(s.index) for s in first if s.op == op and word in s.source])
    d_k = r.d_model // r.heads
    if r.scoring.qk_norm:
        lines.append(f"QK-norm ({rows('rms_norm')}): each head's q and k scaled to unit RMS over its "
                     f"{d_k} dims (RMSNorm, a learned gain a dim), before RoPE and q·k: with gains of "
                     f"1, ‖q‖ = ‖k‖ = √d_k, so no score |q·k|/√d_k exceeds √d_k = {d_k ** 0.5:.3g}.")
    if r.scoring.alibi:
        lines.append(f"ALiBi ({rows('add', 'alibi')}): each head's scores get -m_h·|i - j| added, slopes "
                     f"2^(-8h/H) from head 1's {2 ** (-8 / r.heads):.3g}; a constant (H, T, T) bias, "
                     f"made from positions alone, so nothing about position is learned.")
    if r.scoring.diff:
        lines.append(f"Differential attention ({rows('sub', 'maps')}): each head's q and k split in halves of "
                     f"{d_k // 2} dims, two softmax maps scaled by √{d_k // 2}, the second taken away λ times "
                     f"(λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + 0.2); each head's Σ w·v is RMS-normed and times "
                     f"1 - 0.2. Weights may be negative and rows sum to 1 - λ: what both maps share (noise) cancels.")
    if r.scoring.softcap is not None:
        c = r.scoring.softcap
        lines.append(f"Soft-capping ({rows('tanh')}): each score s becomes {c:g}·tanh(s / {c:g}), "
                     f"before the mask: near 0 it is s, and no score reaches ±{c:g}, however large "
                     f"q·k grows (Gemma 2 caps at 50).")
    if r.scoring.sinks is not None:
        which = ("a learned logit a head (gpt-oss)" if r.scoring.sinks == "learned"
                 else "a logit fixed at 0 (the off-by-one softmax)")
        lines.append(f"Sink ({rows('cat', 'sink')}): {which} joins each row of scores as one more column, "
                     f"the softmax runs over T_keys + 1 columns, and the sink's column is dropped: "
                     f"each row of weights sums to less than 1, and what is missing went to nothing.")
    return lines


IMPLS = {"sdpa": ("fused", "sdpa (F.scaled_dot_product_attention)"),
         "tiled": ("tiled", "tiled (FlashAttention-2's loop)")}


def _tiled_note(report: ShapesReport) -> str:
    """The tiled path in words: its tiles, and the largest tensor it makes."""
    r, T, Tk = report.sizes, report.query_len, report.key_len
    bq, bk = r.block_q or -(-T // 2), r.block_k or -(-Tk // 2)
    big = report.largest_made
    tiles = lambda n, block, kind: (f"{-(-n // block)} {kind} tile{'s' if block < n else ''} of "
                                    f"{min(block, n)} row{'s' if min(block, n) > 1 else ''}"
                                    + (f" (the last {n % block})" if block < n and n % block else ""))
    return (f"Tiled path (FlashAttention-2's loop): {tiles(T, bq, 'query')} × "
            f"{tiles(Tk, bk, 'key')}; for each query tile a running max m, sum ℓ and "
            f"unnormalised output, rescaled by exp(m_old − m_new) as each key tile arrives, then "
            f"divided by ℓ once; L = m + log ℓ is kept for the backward. No [{r.batch}, {r.heads}, "
            f"{T}, {Tk}] tensor is formed: the largest is row {big.index} {big.op} "
            f"{shape_text(big.shape)}.")


def compare_impl_table(explicit: ShapesReport, other: ShapesReport) -> list:
    """Explicit against the fused or tiled path: what each allocates, the tensors only the
    explicit path makes, and how far the outputs differ."""
    short, name = IMPLS[other.sizes.impl]
    table = new_table(f"Explicit against {short} (the same sizes, mask and weights)")
    table.add_column("implementation")
    table.add_column("new tensors", justify="right")
    table.add_column("allocated", justify="right")
    table.add_column("largest tensor made")
    for label, rep in (("explicit (the lecture's formula)", explicit), (name, other)):
        big = rep.largest_made
        table.add_row(label, str(sum(1 for s in rep.steps if s.bytes)), human_bytes(rep.bytes_allocated),
                      f"{big.op} {shape_text(big.shape)}")
    gone = [s for s in explicit.steps if len(s.shape) == 4 and s.shape[-1] == explicit.key_len
            and s.shape[-2] == explicit.query_len and s.bytes]
    lines = [f"Never materialised by the {short} path: " + "; ".join(
        f"row {s.index} {s.op} {shape_text(s.shape)} {human_bytes(s.bytes)}" for s in gone) + "."]
    diff = other.max_diff(explicit)
    agree = ("the outputs are not computed on meta" if diff is None else
             f"the outputs differ by at most {diff:.2e} ({other.sizes.dtype}: the sums run in "
             f"another order)" if diff else "the outputs are bit-identical")
    saved = explicit.bytes_allocated - other.bytes_allocated
    lines.append(f"Saved: {human_bytes(saved)} of {human_bytes(explicit.bytes_allocated)}; {agree}."
                 if saved >= 0 else
                 f"In all the {short} path allocates {human_bytes(-saved)} more here (every tile's "
                 f"temporaries counted, as if none were freed; none is T×T); {agree}.")
    return [table, Text("\n".join(lines))]
