"""What the scores' variants add to attention's cost (core.scoring's switches), from first principles,
without torch: QK-norm's gains and RMSNorms, ALiBi's bias, T5's bias table, the soft cap's three operations a score,
a sink's extra column, and differential attention's second map, λ and per-head norm.

Each is a list of rows in `costs`'s form, (item, formula, the formula with numbers, value), counted
as the lecture module computes it (an RMSNorm: 4 FLOPs an element; tanh: 1).
"""


def scoring_parameters(d) -> dict:
    """{item: (formula, numbers, parameters)} of the variants' own parameters."""
    s, k = d.scoring, d.d_k
    rows = {}
    if s.qk_norm:
        rows["q_norm, k_norm (gains)"] = ("2·d_k", f"2·{k}", 2 * k)
    if s.relative_bias:
        rows["T5's bias table (32 buckets a head)"] = ("32·H", f"32·{d.heads}", 32 * d.heads)
    if s.diff:
        rows["λ_q1, λ_k1, λ_q2, λ_k2"] = ("4·d_k/2", f"4·{k // 2}", 4 * (k // 2))
    return rows


def scoring_flop_stages(d, pairs: tuple) -> tuple:
    """The stages the variants add to one forward pass, in the module's order: (after the
    projections, after the scale, after the softmax). pairs: the scored query-key pairs a head, as
    (formula, numbers, count)."""
    s, B, T, H, G, k = d.scoring, d.batch, d.seq, d.heads, d.kv_heads, d.d_k
    pf, pn, P = pairs
    normed = [("QK-norm (RMSNorm of q and k)", "4·B·T·(H + G)·d_k", f"4·{B}·{T}·({H} + {G})·{k}",
               4 * B * T * (H + G) * k)] if s.qk_norm else []
    scored = [(("T5's" if s.relative_bias else "ALiBi's") + " bias added", f"B·H·{pf}", f"{B}·{H}·{pn}", B * H * P)
              ] if s.alibi or s.relative_bias else []
    if s.softcap is not None:
        scored.append(("soft cap c·tanh(s / c)", f"3·B·H·{pf}", f"3·{B}·{H}·{pn}", 3 * B * H * P))
    mixed = [("second map: its scale and softmax", f"6·B·H·{pf}", f"6·{B}·{H}·{pn}", 6 * B * H * P),
             ("map 1 − λ·map 2", f"2·B·H·{pf}", f"2·{B}·{H}·{pn}", 2 * B * H * P),
             ("head norm and × (1 − λ_init)", "5·B·T·H·d_k", f"5·{B}·{T}·{H}·{k}", 5 * B * T * H * k)] if s.diff else []
    return normed, scored, mixed
