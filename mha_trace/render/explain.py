"""Render `explain`: one query token through every head, each product written out."""

from rich.text import Text

from mha_trace.io.output import new_table
from mha_trace.analyses.walk import ModuleWalk, Walk
from mha_trace.records import data, renderables
from mha_trace.render.matrices import (MASKED, MAX_DIMS, matrix_table, config_data, describe, fmt,
                                       shade, sharing_table, short, vector)


def _query(q, decimals: int) -> str:
    """The chapter's short numbers for a small head; the first 8 and a count for a big one."""
    return "[" + ", ".join(short(x) for x in q) + "]" if len(q) <= 8 else vector(q, decimals, 8)


def _dot_text(products, dot: float, decimals: int) -> str:
    terms = [f"{short(q)}×{short(k)}" for q, k in products]
    if len(terms) > 4:
        terms = terms[:2] + ["…"] + terms[-1:]
        return " + ".join(terms) + f" = {fmt(dot, decimals)} ({len(products)} terms)"
    return " + ".join(terms) + f" = {fmt(dot, decimals)}"


def explain_renderables(w, decimals: int, only_head: int | None) -> list:
    view = w.view
    c = view.config
    out = [Text(f"{view.through(w.token, only_head, w.position)}  ({describe(view)})", style="bold")]
    if c.origin:
        biases = " plus their biases" if view.b_O is not None else ""
        turned = ", q and k then turned by RoPE" if c.rope else ""
        out.append(Text(f"q, k, v are this layer's input (the hidden states of the {len(c.tokens)} "
                        f"tokens) times the trained W_qᵀ, W_kᵀ, W_vᵀ{biases}{turned}; the walk "
                        f"starts from those projections."))
    elif view.latent is not None:
        out.append(_latent_words(view))
    elif not c.explicit:
        out.append(Text(f"q, k, v are the seeded embeddings times W_qᵀ, W_kᵀ, W_vᵀ (seed "
                        f"{c.seed}); the walk starts from those projections."))
    out += _scoring_words(view.config.scoring)
    if view.kv_heads != view.heads:
        out.append(sharing_table(view))
    if w.why:
        from mha_trace.render.why import why_renderables, why_words

        out.append(why_words(w.why[0]))
        for why in w.why:
            hw = w.heads[why.head - 1]
            if hw.terms[0].effect is not None:  # --effect too: the walk's table, then the split
                out.append(_head_table(w, hw, decimals))
            out += why_renderables(view.tokens, w.token, why, decimals, view.head_name(why.head))
        return out + _after_heads(w, decimals)
    out += [_head_table(w, hw, decimals) for hw in w.heads if not only_head or hw.head == only_head]
    if w.heads[0].terms[0].effect is not None:
        out.append(Text(EFFECT_WORDS))
    return out + _after_heads(w, decimals)


def _scoring_words(scoring) -> list:
    """What the walk does past q·k/√d_k, before its tables: QK-norm, the cap, the sink."""
    words = []
    if scoring.qk_norm:
        words.append("QK-norm: each head's q and k are divided by their RMS over the head's dims "
                     "(times a learned gain, 1 here) before the dot products, so no |q·k| exceeds d_k.")
    if scoring.alibi:
        words.append("ALiBi: each head adds -m·|i - j| to the scaled score, its slope m a power of 1/2 "
                     "(2^(-8h/H) for head h): the farther the key, the lower its score; no position is learned.")
    if scoring.relative_bias:
        words.append("T5's relative bias: each head adds to the scaled score a learned number for the bucket of the "
                     "key's offset j - i (one bucket for each offset below 8 on either side, log-spaced buckets up "
                     "to 128, the rest in the last), so a head learns how much near or far keys, before or after, count.")
    if scoring.softcap is not None:
        c = scoring.softcap
        words.append(f"Soft-capping: each score s goes through {c:g}·tanh(s / {c:g}) before the softmax; "
                     f"small scores pass almost unchanged, none reaches ±{c:g}.")
    if scoring.diff:
        words.append("Differential attention: each head scores every key twice, with the first and the second "
                     "half of its q and k dims; the second softmax is taken away λ times from the first, so what "
                     "both maps give every key cancels, and a weight may be negative.")
    if scoring.sinks is not None:
        words.append("Sink: the softmax runs over the keys and one more logit, the sink, that no value "
                     "stands behind; the keys' weights sum to 1 minus the sink's.")
    return [Text(w) for w in words]


def _latent_words(view) -> Text:
    """MLA in words, with this run's sizes: where a head's key and value come from, the score's two parts."""
    c, p = view.config, view.latent
    words = (f"Latent attention (DeepSeek-V2's MLA): each seeded embedding (seed {c.seed}) goes down to one latent c "
             f"of d_c = {c.latent} dims, and each head's key k_C = W_UK c and value v = W_UV c come up from it; one "
             f"RoPE key k_R of d_R = {p.rope} dims a token serves every head. A head's score is its content part "
             f"q_C·k_C plus its RoPE part q_R·k_R, over √(d_h + d_R) = √{p.d_h + p.rope}.")
    if p.absorbed:
        words += (f" Absorbed, as inference runs it: the content part is (W_UKᵀ q_C)·c, the query taken down to "
                  f"c's {p.content} dims, so no head's key is formed (the same number); the values below are W_UV c, "
                  f"since Σ w·(W_UV c) = W_UV Σ w·c, which is what the absorbed form computes.")
    return Text(words)


def _latent_table(w, hw, decimals: int):
    """One MLA head: each key's content part and RoPE part, their sum ÷ √(d_h + d_R), the softmax."""
    view, p = w.view, w.view.latent
    content = "(W_UKᵀq_C)·c" if p.absorbed else "q_C·k_C"
    query = "W_UKᵀq_C" if p.absorbed else "q_C"
    table = new_table(f"Head {view.head_name(hw.head)}: {query}[{w.token}] = {_query(hw.query[:p.content], decimals)}, "
                      f"q_R[{w.token}] = {_query(hw.query[p.content:], decimals)}, ÷ √{p.d_h + p.rope} = "
                      f"{fmt(w.sqrt_dk, decimals)}")
    for name in ("key", content, "q_R·k_R", f"sum ÷√{p.d_h + p.rope}", "softmax"):
        table.add_column(name, justify="left" if name == "key" else "right")
    effect = hw.terms[0].effect is not None
    if effect:
        table.add_column("‖v·W_O‖", justify="right")
        table.add_column("effect", justify="right")
    for t in hw.terms:
        weight = Text(MASKED + " masked") if t.masked else Text(fmt(t.weight, decimals), style=shade(t.weight))
        moved = [fmt(t.moved, decimals), Text(fmt(t.effect, decimals), style=shade(t.effect))] if effect else []
        table.add_row(t.token, fmt(t.parts[0], decimals), fmt(t.parts[1], decimals), fmt(t.scaled, decimals),
                      weight, *moved, style="dim" if t.masked else None)
    table.caption = weighted_sum(hw, decimals, view.head_name(hw.head))
    table.caption_justify = "left"
    return table


def _differential_table(w, hw, decimals: int):
    """One head of differential attention: each key's score and weight in each map, and their
    difference; the caption says λ and how the head's output is normed."""
    view, (lam, lam_init) = w.view, w.view.lam
    half = view.d_k // 2
    table = new_table(f"Head {view.head_name(hw.head)}: dims {hw.dims[0]}–{hw.dims[1] - 1}, map 1 from q and k's "
                      f"first {half} dims, map 2 from the last {half}, each ÷ √{half}; λ = {fmt(lam, decimals)}")
    for name in ("key", "q₁·k₁÷√d", "softmax₁", "q₂·k₂÷√d", "softmax₂", "softmax₁ − λ·softmax₂"):
        table.add_column(name, justify="left" if name == "key" else "right")
    for t in hw.terms:
        _, scaled_2, first, second = t.second
        cells = [fmt(t.scaled, decimals), fmt(first, decimals), fmt(scaled_2, decimals), fmt(second, decimals)]
        weight = Text(MASKED + " masked") if t.masked else Text(fmt(t.weight, decimals), style=shade(max(t.weight, 0)))
        table.add_row(t.token, *(["", "", "", ""] if t.masked else cells), weight, style="dim" if t.masked else None)
    table.caption = (f"λ = exp(λ_q1·λ_k1) − exp(λ_q2·λ_k2) + λ_init ({lam_init:g}); Σ w·v, RMS-normed over the "
                     f"head's {view.d_k} dims, times 1 − λ_init = {vector(hw.output, decimals)}  → head "
                     f"{view.head_name(hw.head)} output")
    table.caption_justify = "left"
    return table


def _head_table(w, hw, decimals: int):
    """One head's walk: each key's q·k written out, ÷√d_k, the softmax, then Σ w·v."""
    view = w.view
    if view.lam is not None:
        return _differential_table(w, hw, decimals)
    if view.latent is not None:
        return _latent_table(w, hw, decimals)
    kv = f", K/V head {hw.kv_head}" if view.kv_heads != view.heads else ""
    table = new_table(f"Head {view.head_name(hw.head)}: dims {hw.dims[0]}–{hw.dims[1] - 1}{kv}, "
                      f"q[{w.token}] = {_query(hw.query, decimals)}, "
                      f"÷ √{view.d_k} = {fmt(w.sqrt_dk, decimals)}")
    table.add_column("key")
    table.add_column("q·k", overflow="fold")
    table.add_column("÷√d_k", justify="right")
    cap, alibi = view.config.scoring.softcap, view.bias is not None
    if alibi:
        table.add_column("+ T5 bias" if view.config.scoring.relative_bias else "+ ALiBi", justify="right")
    if cap is not None:
        table.add_column(f"{cap:g}·tanh(s/{cap:g})", justify="right")
    table.add_column("softmax", justify="right")
    effect = hw.terms[0].effect is not None
    if effect:
        table.add_column("‖v·W_O‖", justify="right")
        table.add_column("effect", justify="right")
    for t in hw.terms:
        weight = Text(MASKED + " masked") if t.masked else Text(fmt(t.weight, decimals),
                                                                 style=shade(t.weight))
        moved = [fmt(t.moved, decimals), Text(fmt(t.effect, decimals), style=shade(t.effect))
                 ] if effect else []
        capped = ([fmt(t.bias, decimals)] if alibi else []) + ([] if cap is None else [fmt(t.capped, decimals)])
        table.add_row(t.token, _dot_text(t.products, t.dot, decimals),
                      fmt(t.scaled, decimals), *capped, weight, *moved, style="dim" if t.masked else None)
    if hw.sink is not None:
        logit, share = hw.sink
        learned = "this head's learned logit" if view.config.scoring.sinks == "learned" else "fixed at 0"
        logits = [""] * (alibi + (cap is not None)) + [fmt(logit, decimals)]  # neither biased nor capped
        table.add_row("(sink)", learned, *logits,
                      Text(fmt(share, decimals), style=shade(share)), *[""] * (2 * effect), style="italic")
    table.caption = weighted_sum(hw, decimals, view.head_name(hw.head))
    table.caption_justify = "left"
    return table


EFFECT_WORDS = ("‖v·W_O‖: the length of what the key's value adds to the output through this "
                "head's block of W_O; effect: softmax × ‖v·W_O‖, renormalised (Kobayashi et al. "
                "2020).")


def _after_heads(w, decimals: int) -> list:
    """The concatenation of the heads' outputs, W_O and the token's output."""
    view, c, out = w.view, w.view.config, []
    if len(w.heads) <= 4:
        parts = " | ".join(vector(hw.output, decimals) for hw in w.heads)
        out.append(Text(f"Concatenation: [{parts}] = {vector(w.concat, decimals)}"))
    else:
        out.append(Text(f"Concatenation of the {len(w.heads)} head outputs: "
                        f"{vector(w.concat, decimals)}"))
    if view.wo_identity:
        out.append(Text("W_O is the identity here (the chapter skips it), so the output for "
                        f"'{w.token}' is the concatenation: {vector(w.output, decimals)}"))
        return out
    if len(view.W_O) <= MAX_DIMS:
        out.append(matrix_table("W_O (rows: concatenation dims, columns: output dims)",
                                 [f"c{i}" for i in range(len(view.W_O))], view.W_O, decimals))
    else:
        n = len(view.W_O)
        what = f"a trained {n}×{n} matrix" if c.origin else f"a {n}×{n} matrix drawn from the seed"
        out.append(Text(f"W_O is {what}; "
                        "every output dim mixes every head."))
    bias = "" if view.b_O is None else " + b_O"
    out.append(Text(f"Output = concatenation @ W_O{bias} = {vector(w.output, decimals)}"))
    return out


def weighted_sum(hw, decimals: int, name: str) -> str:
    """Σ_j w_j·v_j written out for small heads; summarised by its largest terms otherwise."""
    used = [(t, v) for t, v in zip(hw.terms, hw.values) if not t.masked and t.weight]
    result = f" = {vector(hw.output, decimals)}  → head {name} output"
    if len(hw.output) <= 4 and len(used) <= 6:
        return "weighted sum of V: " + " + ".join(
            f"{fmt(t.weight, decimals)}×[{', '.join(short(x) for x in v)}]" for t, v in used) + result
    top = sorted(used, key=lambda tv: -tv[0].weight)[:3]
    names = ", ".join(f"{t.token} {fmt(t.weight, decimals)}" for t, _ in top)
    return f"weighted sum of the {len(used)} value rows (largest weights: {names})" + result


def explain_data(w, decimals: int, only_head: int | None) -> dict:
    from mha_trace.render.why import why_data

    r = lambda x: float(x)  # JSON keeps full precision
    return {
        "command": "explain",
        "config": config_data(w.view),
        "decimals": decimals,
        "token": w.token,
        "position": w.position,
        "sqrt_d_k": r(w.sqrt_dk),
        "heads": [{"head": hw.head, "dims": list(hw.dims), "kv_head": hw.kv_head,
                   "query": [r(x) for x in hw.query],
                   "keys": [{"token": t.token, "products": [[r(q), r(k)] for q, k in t.products],
                             "dot": r(t.dot), "scaled": r(t.scaled), "masked": t.masked,
                             "weight": r(t.weight),
                             **({} if t.capped is None else {"capped": r(t.capped)}),
                             **({} if t.bias is None else {"relative_bias" if w.view.config.scoring.relative_bias
                                                          else "alibi": r(t.bias)}),
                             **({} if t.parts is None else {"content": r(t.parts[0]), "rope": r(t.parts[1])}),
                             **({} if t.second is None else {"second": {"dot": r(t.second[0]), "scaled": r(t.second[1]),
                                                                        "map_1": r(t.second[2]), "map_2": r(t.second[3])}}),
                             **({} if t.effect is None else {"moved": r(t.moved),
                                                             "effect": r(t.effect)})}
                            for t in hw.terms],
                   **({} if hw.sink is None else {"sink": {"logit": r(hw.sink[0]), "weight": r(hw.sink[1])}}),
                   "output": [r(x) for x in hw.output]}
                  for hw in w.heads if not only_head or hw.head == only_head],
        "concat": [r(x) for x in w.concat],
        "output": [r(x) for x in w.output],
        "W_O_identity": w.view.wo_identity,
        **({} if not w.why else {"why": [{"head": y.head, **why_data(y, w.view.tokens)}
                                         for y in w.why]}),
    }


def module_explain_renderables(m, i: int, decimals: int, only_head: int | None,
                               why: list | None = None) -> list:
    """A foreign module exposes its weights, not its projections: its walk starts at the softmax
    (with --why, its scores caught as they are computed, split into their dims)."""
    out = [Text(f"{m.label}, {m.call}: the query '{m.tokens[i]}' (position {i})", style="bold"),
           Text("Your module returns its attention weights but not its Q, K and V, so the dot "
                "products cannot be written out" + (" from them; --why caught them as it ran "
                "(below)." if why else "; here is what it computed for this query."))]
    names = ["weights as returned (averaged over heads)"] if m.averaged else [
        f"head {h + 1}" for h in range(len(m.weights))]
    table = new_table(f"Weights of the query '{m.tokens[i]}'")
    table.add_column("key")
    picked = [only_head - 1] if only_head else range(len(m.weights))
    for h in picked:
        table.add_column(names[h], justify="right", no_wrap=True)
    for j, t in enumerate(m.tokens):
        masked = m.mask is not None and not m.mask[i][j]
        table.add_row(t, *(MASKED if masked else fmt(m.weights[h][i][j], decimals) for h in picked))
    out.append(table)
    out.append(Text(f"Output for '{m.tokens[i]}': {vector(m.output[i], decimals)}"))
    if why:
        from mha_trace.render.why import why_renderables

        out.append(Text("--why: the first T×T product in your forward is taken for q·k (its "
                        "softmax ÷ √d_k gives back the weights your module returned), split into "
                        "the head's d_k products."))
        for y in why:
            out += why_renderables(m.tokens, m.tokens[i], y, decimals)
    return out


def module_explain_data(m, i: int, decimals: int, only_head: int | None,
                        why: list | None = None) -> dict:
    from mha_trace.render.why import why_data

    picked = [only_head - 1] if only_head else range(len(m.weights))
    return {"command": "explain", "module": m.label, "call": m.call, "token": m.tokens[i],
            "position": i, "decimals": decimals, "averaged": m.averaged,
            "heads": [{"head": h + 1, "weights": [float(x) for x in m.weights[h][i]]}
                      for h in picked],
            "output": [float(x) for x in m.output[i]],
            **({"why": [{"head": y.head, **why_data(y, m.tokens)} for y in why]} if why else {})}


@renderables.register(Walk)
def _walk(w, width: int, decimals: int = 4, head: int | None = None, **_) -> list:
    return explain_renderables(w, decimals, head or w.only)


@data.register(Walk)
def _walk_data(w, decimals: int = 4, head: int | None = None, **_) -> dict:
    return explain_data(w, decimals, head or w.only)


@renderables.register(ModuleWalk)
def _module_walk(w, width: int, decimals: int = 4, head: int | None = None, **_) -> list:
    return module_explain_renderables(w.view, w.position, decimals, head or w.only, w.why)


@data.register(ModuleWalk)
def _module_walk_data(w, decimals: int = 4, head: int | None = None, **_) -> dict:
    return module_explain_data(w.view, w.position, decimals, head or w.only, w.why)


import mha_trace.render.walk_slide  # noqa: E402,F401 (registers the slide of what this file shows)
import mha_trace.render.page  # noqa: E402,F401 (registers the page of what this file shows)
