"""Renderers for `heads`, `explain` and `configs`: rich tables and JSON-ready data."""

import numpy as np
from rich.columns import Columns
from rich.style import Style
from rich.table import Table
from rich.text import Text

from mha_trace.analysis import distinct_rows
from mha_trace.output import new_table

MASKED = "·"
MAX_DIMS = 6  # matrices wider than this show their first dims; JSON has them all


def fmt(x: float, decimals: int) -> str:
    s = f"{x:.{decimals}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s  # no "-0.0000"


def short(x: float) -> str:
    """Inputs as the chapter writes them: 1.0, 0.5, and 4 decimals only where needed."""
    return f"{x:.1f}" if abs(x * 10 - round(x * 10)) < 1e-12 else f"{x:.4f}"


def vector(values, decimals: int, limit: int = 16) -> str:
    """[a, b, c]; past `limit` numbers, the first 8 and a count (JSON has them all)."""
    if len(values) > limit:
        shown = ", ".join(fmt(x, decimals) for x in values[:8])
        return f"[{shown}, … {len(values) - 8} more]"
    return "[" + ", ".join(fmt(x, decimals) for x in values) + "]"


def shade(weight: float) -> Style:
    """Cell background: dark (little attention) to bright blue (a lot); stripped when plain."""
    w = max(0.0, min(1.0, weight))
    r, g, b = (int(20 + (a - 20) * w) for a in (40, 120, 255))
    return Style(bgcolor=f"rgb({r},{g},{b})", color="white" if w < 0.6 else "black")


def legend() -> Text:
    return Text(f"Rows are queries, columns keys; each row sums to 1. On a colour terminal cells "
                f"are shaded by weight (brighter = more) and each row's largest is bold. "
                f"{MASKED} marks a masked key (weight exactly 0).")


class _WeightsTable:
    """A weight matrix that splits its key columns into several tables when it cannot fit.

    Numbers are never cut: at 80 columns an 11-token sentence prints as two tables of keys.
    """

    def __init__(self, title: str, tokens, weights, mask, decimals: int):
        self.title, self.tokens, self.weights = title, list(tokens), weights
        self.mask, self.decimals = mask, decimals

    def _widths(self) -> list[int]:
        return [max(self.decimals + 2, len(t)) for t in self.tokens]

    def _label_width(self) -> int:
        return max(len("q \\ k"), *(len(t) for t in self.tokens))

    def table(self, keys=None) -> Table:
        keys = range(len(self.tokens)) if keys is None else keys
        table = new_table()
        table.add_column("q \\ k", style="bold", no_wrap=True)
        for j in keys:
            table.add_column(self.tokens[j], justify="right", no_wrap=True)
        for i, row in enumerate(self.weights):
            best = max(range(len(row)), key=lambda j: row[j])
            cells = []
            for j in keys:
                if self.mask is not None and not self.mask[i][j]:
                    cells.append(Text(MASKED, justify="center"))
                else:
                    style = shade(row[j]) + Style(bold=j == best)
                    cells.append(Text(fmt(row[j], self.decimals), style=style))
            table.add_row(self.tokens[i], *cells)
        return table

    def _chunks(self, width: int) -> list[range]:
        room, chunks, start, used = width - self._label_width(), [], 0, 0
        for j, w in enumerate(self._widths()):
            if j > start and used + w + 2 > room:
                chunks.append(range(start, j))
                start, used = j, 0
            used += w + 2
        chunks.append(range(start, len(self.tokens)))
        return chunks

    def __rich_console__(self, console, options):
        yield Text(self.title, style="bold blue")
        chunks = self._chunks(options.max_width)
        for keys in chunks:
            if len(chunks) > 1:
                yield Text(f"keys {keys.start + 1}–{keys.stop} of {len(self.tokens)} "
                           f"(--width {self._label_width() + sum(self._widths()) + 2 * len(self.tokens)} "
                           f"shows them in one table)", style="dim")
            yield self.table(keys)

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        full = self._label_width() + sum(self._widths()) + 2 * len(self.tokens)
        return Measurement(min(full, options.max_width), full)

    def markdown(self) -> str:
        from mha_trace.output import table_markdown

        table = self.table()
        table.title = self.title
        return table_markdown(table)


def _weights_table(title: str, tokens, weights, mask, decimals: int) -> _WeightsTable:
    return _WeightsTable(title, tokens, weights, mask, decimals)


def _matrix_table(title: str, tokens, matrix, decimals: int, first: int = 0) -> Table:
    width = matrix.shape[1]
    shown = min(width, MAX_DIMS)
    table = new_table(title)
    table.add_column("token", style="bold")
    for d in range(shown):
        table.add_column(f"d{first + d}", justify="right", no_wrap=True)
    if shown < width:
        table.add_column(f"… {width - shown} more", justify="left")
    for t, row in zip(tokens, matrix):
        extra = ["…"] if shown < width else []
        table.add_row(t, *(fmt(x, decimals) for x in row[:shown]), *extra)
    return table


def head_title(view, h: int) -> str:
    d_k, start = view.d_k, h * view.d_k
    kv = f", K/V head {view.kv_head_of(h) + 1}" if view.kv_heads != view.heads else ""
    return (f"Head {h + 1} of {view.heads}: dims {start}–{start + d_k - 1}, d_k = {d_k}{kv}")


def heads_renderables(view, decimals: int, only_head: int | None) -> list:
    c = view.config
    out = [Text(f"{c.title}  ({describe(view)})", style="bold")]
    heads = [only_head - 1] if only_head else range(view.heads)
    for h in heads:
        out.append(_weights_table(head_title(view, h), view.tokens, view.weights[h], view.mask,
                                  decimals))
    if view.kv_heads != view.heads:
        out.append(sharing_table(view))
    if not only_head and view.heads > 1:
        out.append(_weights_table("Average over heads (what a single averaged map would show)",
                                  view.tokens, view.weights.mean(0), view.mask, decimals))
    if view.wo_identity:
        out.append(_matrix_table("Output = concatenation of the heads (W_O is the identity)",
                                 view.tokens, view.output, decimals))
    else:
        out.append(_matrix_table("Concatenation of the heads (before W_O)", view.tokens,
                                 view.concat, decimals))
        out.append(_matrix_table("Output = concatenation @ W_O (W_O mixes the heads)",
                                 view.tokens, view.output, decimals))
    out.append(legend())
    return out


def sharing_table(view) -> Table:
    table = new_table(f"Grouped-query attention: {view.heads} query heads share "
                      f"{view.kv_heads} K/V heads")
    table.add_column("K/V head", justify="right")
    table.add_column("query heads")
    for g in range(view.kv_heads):
        members = [str(h + 1) for h in range(view.heads) if view.kv_head_of(h) == g]
        table.add_row(str(g + 1), ", ".join(members))
    return table


def describe(view) -> str:
    c = view.config
    form = "explicit Q, K, V" if c.explicit else f"generated, seed {c.seed}"
    parts = [f"{len(c.tokens)} tokens", f"d_model {c.d_model}",
             f"{c.heads} head" + ("s" if c.heads > 1 else ""),
             f"d_k {c.d_k}", form]
    if view.kv_heads != view.heads:
        parts.insert(3, f"{view.kv_heads} K/V heads")
    if c.mask != "none":
        parts.append(f"mask {c.mask}")
    if c.pad:
        parts.append(f"pad {c.pad}")
    return ", ".join(parts)


def _rounded(matrix, decimals: int):
    return [[round(float(x), decimals) for x in row] for row in matrix]


def config_data(view) -> dict:
    c = view.config
    return {"name": c.name, "title": c.title, "tokens": list(c.tokens), "d_model": c.d_model,
            "heads": c.heads, "kv_heads": view.kv_heads, "d_k": c.d_k, "mask": c.mask,
            "pad": c.pad, "explicit": c.explicit, "seed": None if c.explicit else c.seed}


def heads_data(view, decimals: int, only_head: int | None) -> dict:
    heads = [only_head - 1] if only_head else range(view.heads)
    return {
        "command": "heads",
        "config": config_data(view),
        "decimals": decimals,
        "mask": None if view.mask is None else view.mask.tolist(),
        "heads": [{"head": h + 1, "dims": [h * view.d_k, (h + 1) * view.d_k],
                   "kv_head": view.kv_head_of(h) + 1,
                   "weights": _rounded(view.weights[h], decimals)} for h in heads],
        "average": _rounded(view.weights.mean(0), decimals),
        "concat": _rounded(view.concat, decimals),
        "output": _rounded(view.output, decimals),
        "W_O_identity": view.wo_identity,
    }


def _dot_text(products, dot: float, decimals: int) -> str:
    terms = [f"{short(q)}×{short(k)}" for q, k in products]
    if len(terms) > 4:
        terms = terms[:2] + ["…"] + terms[-1:]
        return " + ".join(terms) + f" = {fmt(dot, decimals)} ({len(products)} terms)"
    return " + ".join(terms) + f" = {fmt(dot, decimals)}"


def explain_renderables(w, decimals: int, only_head: int | None) -> list:
    view = w.view
    c = view.config
    out = [Text(f"{c.title}: the query '{w.token}' (position {w.position}) through every head  "
                f"({describe(view)})", style="bold")]
    if not c.explicit:
        out.append(Text(f"q, k, v are the seeded embeddings times W_qᵀ, W_kᵀ, W_vᵀ (seed "
                        f"{c.seed}); the walk starts from those projections."))
    if view.kv_heads != view.heads:
        out.append(sharing_table(view))
    sqrt_txt = f"√{view.d_k} = {fmt(w.sqrt_dk, decimals)}"
    for hw in w.heads:
        if only_head and hw.head != only_head:
            continue
        kv = f", K/V head {hw.kv_head}" if view.kv_heads != view.heads else ""
        table = new_table(f"Head {hw.head}: dims {hw.dims[0]}–{hw.dims[1] - 1}{kv}, "
                          f"q[{w.token}] = [{', '.join(short(x) for x in hw.query)}], "
                          f"÷ {sqrt_txt}")
        table.add_column("key")
        table.add_column("q·k", overflow="fold")
        table.add_column("÷√d_k", justify="right")
        table.add_column("softmax", justify="right")
        for t in hw.terms:
            weight = Text(MASKED + " masked") if t.masked else Text(fmt(t.weight, decimals),
                                                                     style=shade(t.weight))
            table.add_row(t.token, _dot_text(t.products, t.dot, decimals),
                          fmt(t.scaled, decimals), weight, style="dim" if t.masked else None)
        table.caption = weighted_sum(hw, decimals)
        table.caption_justify = "left"
        out.append(table)
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
        out.append(_matrix_table("W_O (rows: concatenation dims, columns: output dims)",
                                 [f"c{i}" for i in range(len(view.W_O))], view.W_O, decimals))
    else:
        out.append(Text(f"W_O is a {len(view.W_O)}×{len(view.W_O)} matrix drawn from the seed; "
                        "every output dim mixes every head."))
    out.append(Text(f"Output = concatenation @ W_O = {vector(w.output, decimals)}"))
    return out


def weighted_sum(hw, decimals: int) -> str:
    """Σ_j w_j·v_j written out for small heads; summarised by its largest terms otherwise."""
    used = [(t, v) for t, v in zip(hw.terms, hw.values) if not t.masked and t.weight]
    result = f" = {vector(hw.output, decimals)}  → head {hw.head} output"
    if len(hw.output) <= 4 and len(used) <= 6:
        return "weighted sum of V: " + " + ".join(
            f"{fmt(t.weight, decimals)}×[{', '.join(short(x) for x in v)}]" for t, v in used) + result
    top = sorted(used, key=lambda tv: -tv[0].weight)[:3]
    names = ", ".join(f"{t.token} {fmt(t.weight, decimals)}" for t, _ in top)
    return f"weighted sum of the {len(used)} value rows (largest weights: {names})" + result


def explain_data(w, decimals: int, only_head: int | None) -> dict:
    r = lambda x: round(float(x), decimals)
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
                             "weight": r(t.weight)} for t in hw.terms],
                   "output": [r(x) for x in hw.output]}
                  for hw in w.heads if not only_head or hw.head == only_head],
        "concat": [r(x) for x in w.concat],
        "output": [r(x) for x in w.output],
        "W_O_identity": w.view.wo_identity,
    }


def reading(view, first) -> str:
    """One line on what this head count does to the patterns."""
    rows = [distinct_rows(w) for w in view.weights]
    T = len(view.tokens)
    parts = [f"d_k = {view.d_k}"]
    if view.d_k == 1:
        parts.append("each score is a product of two single numbers, so a query can only rank "
                     "keys by one coordinate and rows repeat")
    elif view.heads == 1:
        parts.append("one head: a single compromise pattern per query")
    else:
        parts.append(f"{view.heads} heads see {view.heads} different {view.d_k}-dim subspaces")
    parts.append(f"distinct weight rows per head: {', '.join(map(str, rows))} of {T}")
    if first is not view:
        parts.append(f"output moved {np.linalg.norm(view.output - first.output):.4f} (L2) from "
                     f"H = {first.heads}")
    return "; ".join(parts) + "."


def compare_renderables(views, decimals: int) -> list:
    c = views[0].config
    out = [Text(f"{c.title}: the same Q, K, V split into {', '.join(str(v.heads) for v in views)} "
                f"heads", style="bold")]
    for v in views:
        out.append(Text(f"H = {v.heads}, d_k = {v.d_k}", style="bold underline"))
        tables = [_weights_table(f"head {h + 1}", v.tokens, v.weights[h], v.mask, decimals)
                  for h in range(v.heads)]
        out.append(Columns(tables, padding=(0, 4)))
        out.append(_matrix_table(f"output (H = {v.heads})", v.tokens, v.output, decimals))
        out.append(Text(reading(v, views[0])))
    out.append(legend())
    return out


def compare_data(views, decimals: int) -> dict:
    return {"command": "compare", "config": config_data(views[0]), "decimals": decimals,
            "runs": [{"heads": v.heads, "d_k": v.d_k,
                      "weights": [_rounded(w, decimals) for w in v.weights],
                      "distinct_rows": [distinct_rows(w) for w in v.weights],
                      "output": _rounded(v.output, decimals),
                      "reading": reading(v, views[0])} for v in views]}


def ablate_renderables(a, decimals: int) -> list:
    view = a.view
    names = ", ".join(map(str, a.removed))
    out = [Text(f"{view.config.title}: output without head{'s' if len(a.removed) > 1 else ''} "
                f"{names} (zeroed before W_O)  ({describe(view)})", style="bold")]
    table = new_table("Per-token change")
    table.add_column("token", style="bold")
    table.add_column("full output", overflow="fold")
    table.add_column("ablated output", overflow="fold")
    table.add_column("L2 distance", justify="right")
    for t, full, abl, dist in zip(view.tokens, view.output, a.output, a.per_token):
        table.add_row(t, vector(full, decimals, 8), vector(abl, decimals, 8), fmt(dist, decimals))
    out.append(table)
    out.append(Text(f"Total L2 distance: {fmt(a.total, decimals)} "
                    f"({a.relative:.1%} of the full output's norm {fmt(np.linalg.norm(view.output), decimals)})."))
    return out


def ablate_data(a, decimals: int) -> dict:
    return {"command": "ablate", "config": config_data(a.view), "decimals": decimals,
            "removed": a.removed, "full_output": _rounded(a.view.output, decimals),
            "output": _rounded(a.output, decimals),
            "per_token_l2": [round(float(x), decimals) for x in a.per_token],
            "total_l2": round(a.total, decimals), "relative": round(a.relative, decimals)}


def module_heads_renderables(m, decimals: int, only_head: int | None) -> list:
    out = [Text(f"{m.label}, {m.call}: {' '.join(m.tokens)}  (seeded embeddings, batch 1)",
                style="bold")]
    if m.averaged:
        out.append(Text("This module returns one weight map averaged over its heads, so per-head "
                        "patterns are not available."))
    heads = [only_head - 1] if only_head else range(len(m.weights))
    for h in heads:
        name = "weights as returned (averaged over heads)" if m.averaged else f"Head {h + 1} of {len(m.weights)}"
        out.append(_weights_table(name, m.tokens, m.weights[h], m.mask, decimals))
    out.append(_matrix_table("Output", m.tokens, m.output, decimals))
    out.append(legend())
    return out


def module_heads_data(m, decimals: int, only_head: int | None) -> dict:
    heads = [only_head - 1] if only_head else range(len(m.weights))
    return {"command": "heads", "module": m.label, "call": m.call, "tokens": list(m.tokens),
            "decimals": decimals, "averaged": m.averaged,
            "mask": None if m.mask is None else m.mask.tolist(),
            "heads": [{"head": h + 1, "weights": _rounded(m.weights[h], decimals)} for h in heads],
            "output": _rounded(m.output, decimals)}


def module_explain_renderables(m, i: int, decimals: int, only_head: int | None) -> list:
    """A foreign module exposes its weights, not its projections: its walk starts at the softmax."""
    out = [Text(f"{m.label}, {m.call}: the query '{m.tokens[i]}' (position {i})", style="bold"),
           Text("Your module returns its attention weights but not its Q, K and V, so the dot "
                "products cannot be written out; here is what it computed for this query.")]
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
    return out


def module_explain_data(m, i: int, decimals: int, only_head: int | None) -> dict:
    picked = [only_head - 1] if only_head else range(len(m.weights))
    return {"command": "explain", "module": m.label, "call": m.call, "token": m.tokens[i],
            "position": i, "decimals": decimals, "averaged": m.averaged,
            "heads": [{"head": h + 1, "weights": [round(float(x), decimals) for x in m.weights[h][i]]}
                      for h in picked],
            "output": [round(float(x), decimals) for x in m.output[i]]}
