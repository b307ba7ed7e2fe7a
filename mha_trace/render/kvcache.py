"""Render `cache`: each eviction policy's loss at each budget, what it holds, what it saves."""

import numpy as np
from rich.text import Text

from mha_trace.analyses.kvcache import CacheLab, CacheResult
from mha_trace.core.costs import Dims, kv_cache_bytes
from mha_trace.io.output import new_table
from mha_trace.io.units import human_bytes
from mha_trace.records import data, renderables

STRIP = 64  # characters a strip of positions takes
LEVELS = " ▁▂▃▄▅▆▇█"


def cache_bytes(lab: CacheLab, tokens: int, dtype: str) -> int:
    """The KV cache of `tokens` tokens over every layer, by `cost`'s formula."""
    m = lab.model
    d = Dims(batch=1, seq=tokens, d_model=m.d_model, heads=m.heads, kv_heads=m.kv_heads or m.heads,
             dtype=dtype, bias=False)
    return kv_cache_bytes(d, m.layers, tokens)


def _rows(lab: CacheLab) -> list:
    """[(policy, budget, plain result, renumbered result or None)] in table order."""
    plain = [r for r in lab.results if not r.setting.renumber]
    renumbered = {(r.setting.policy, r.setting.budget): r for r in lab.results if r.setting.renumber}
    return [(r.setting.policy, r.setting.budget, r, renumbered.get((r.setting.policy, r.setting.budget)))
            for r in plain]


def strip(held: np.ndarray) -> str:
    """Positions 0 .. T-1 in STRIP characters, each as full as the share of them held."""
    bins = np.array_split(held, min(STRIP, len(held)))
    return "".join(LEVELS[int(round(float(b.mean()) * (len(LEVELS) - 1)))] for b in bins)


def _size(lab: CacheLab, budget: int | None) -> int:
    return len(lab.ids) if budget is None else min(budget, len(lab.ids))


def _table(lab: CacheLab):
    base = lab.full.nll
    renumber = any(r.setting.renumber for r in lab.results)
    table = new_table(f"Next-token loss over {len(lab.ids)} tokens, by what the cache keeps")
    for name in ("policy", "budget", "loss", "perplexity", "vs full"):
        table.add_column(name, justify="left" if name == "policy" else "right")
    if renumber:
        table.add_column("renumbered", justify="right")
    table.add_column("float32", justify="right")
    table.add_column("fp16", justify="right")
    for policy, budget, r, again in _rows(lab):
        kept = _size(lab, budget)
        cells = [policy, "all" if budget is None else str(budget), f"{r.nll:.3f}",
                 f"{r.perplexity:.2f}", "—" if policy == "full" else f"{round(r.nll - base, 3) + 0.0:+.3f}"]
        if renumber:
            cells.append("" if again is None else f"{again.nll:.3f}")
        cells += [human_bytes(cache_bytes(lab, kept, "float32")),
                  human_bytes(cache_bytes(lab, kept, "float16"))]
        table.add_row(*cells)
    return table


def _strips(lab: CacheLab) -> Text:
    T = len(lab.ids)
    text = Text(f"What each cache holds after the last token (positions 0 to {T - 1}, left to "
                f"right; a full block is held by every layer and K/V head):\n", style="bold")
    lines = [f"{policy} {'' if budget is None else budget}".ljust(12) + strip(r.held)
             for policy, budget, r, _ in _rows(lab)]
    text.append("\n".join(lines))
    return text


def explanation(lab: CacheLab) -> list[str]:
    """What the numbers say, computed from them."""
    T, S, base = len(lab.ids), lab.sinks, lab.full.nll
    found = {(r.setting.policy, r.setting.budget): r for r in lab.results if not r.setting.renumber}
    budgets = sorted({b for _, b in found if b is not None})
    lines = [f"full keeps all {T} tokens; window the last B; sinks the first {S} and the last "
             f"B - {S}; h2o the first {S}, the last B/2 and the rest by the attention they have "
             f"received so far (per K/V head). B counts the token being read."]
    share = (f"averaged over every layer, head and query after it, the first token gets "
             f"{lab.first_share:.0%} of the weight in the full pass, where weight spread evenly "
             f"would give it {lab.even_share:.1%}.")
    if lab.first_share > 2 * lab.even_share:
        lines.append(f"Why the first tokens matter: {share} It is an attention sink: a window "
                     f"that drops it sends that weight elsewhere.")
    else:
        lines.append(f"Here the first token is no sink: {share} Keeping it can win little back.")
    for b in budgets:
        w, s = found.get(("window", b)), found.get(("sinks", b))
        if w and s and b < T and w.nll - base < 0.001:
            lines.append(f"Budget {b}: the window alone loses nothing on this text "
                         f"({round(w.nll - base, 3) + 0.0:+.3f} nats), so the sinks have nothing "
                         f"to win back.")
        elif w and s and b < T:
            gap = w.nll - base
            won = (w.nll - s.nll) / gap
            lines.append(f"Budget {b}: the window alone costs {gap:+.3f} nats (perplexity "
                         f"{lab.full.perplexity:.2f} -> {w.perplexity:.2f}); keeping the first {S} "
                         f"tokens as well gives {s.nll - base:+.3f}, {won:.0%} of the loss back.")
    whole = [b for b in budgets if b >= T]
    if whole:
        said = ", ".join(map(str, whole))
        lines.append(f"Budget{'s' * (len(whole) > 1)} {said} hold{'s' * (len(whole) == 1)} the "
                     f"whole text of {T} tokens: every policy keeps every token, so "
                     f"{'their' if len(whole) > 1 else 'its'} rows equal full and save nothing (a "
                     f"smaller --budget, or more --tokens of a longer text, shows what eviction "
                     f"costs).")
    if budgets:
        small = min(budgets)
        lines.append(f"Memory: budget {small} holds {min(small, T)} of {T} tokens, "
                     f"{human_bytes(cache_bytes(lab, min(small, T), 'float32'))} instead of "
                     f"{human_bytes(cache_bytes(lab, T, 'float32'))} in float32 "
                     f"({1 - min(small, T) / T:.0%} saved; fp16 halves both). The formula is "
                     f"cost's: 2·G·d_k·s·L·tokens.")
    return lines


def cache_renderables(lab: CacheLab) -> list:
    m = lab.model
    out = [Text(f"cache: {m.name} reading {lab.text_name}, {len(lab.ids)} tokens, one at a time "
                f"with a KV cache of at most B tokens", style="bold"), _table(lab), _strips(lab)]
    out.append(Text("\n".join(explanation(lab))))
    return out


def timing(lab: CacheLab) -> str:
    """The wall time of each way the lab ran (on stderr at a terminal: stdout stays the same bytes
    from run to run; JSON has each setting's seconds)."""
    spent = {how: [r.seconds for r in lab.results if r.how == how]
             for how in ("masked", "replayed", "decoded")}
    masked, replayed, real = spent.values()
    parts = [f"{len(masked)} masked pass{'es' if len(masked) > 1 else ''} "
             f"{sum(masked):.1f} s"] if masked else []
    if replayed:
        parts.append(f"{len(replayed)} h2o setting{'s' if len(replayed) > 1 else ''} a layer at a "
                     f"time, evictions replayed, {'together ' if len(replayed) > 1 else ''}"
                     f"{sum(replayed):.1f} s")
    if real:
        parts.append(f"{len(real)} setting{'s' if len(real) > 1 else ''} decoded token by token "
                     f"{'together ' if len(real) > 1 else ''}{sum(real):.1f} s "
                     f"({sum(real) / len(lab.ids) * 1000:.0f} ms a token)")
    return f"Took {sum(map(sum, spent.values())):.1f} s: {', '.join(parts)}."


def _result_data(lab: CacheLab, r: CacheResult) -> dict:
    s, kept = r.setting, _size(lab, r.setting.budget)
    return {"policy": s.policy, "budget": s.budget, "sinks": s.sinks, "renumber": s.renumber,
            "nll": r.nll, "perplexity": r.perplexity, "seconds": round(r.seconds, 3),
            "how": r.how, "decoded": r.decoded, "cache_bytes": {"float32": cache_bytes(lab, kept, "float32"),
                                                  "float16": cache_bytes(lab, kept, "float16")},
            "held": [round(float(h), 4) for h in r.held]}


def cache_data(lab: CacheLab) -> dict:
    return {"command": "cache", "model": lab.model.name, "text": lab.text_name,
            "tokens": len(lab.ids), "sinks": lab.sinks, "first_token_share": lab.first_share,
            "results": [_result_data(lab, r) for r in lab.results]}


@renderables.register(CacheLab)
def _cache(lab, width: int, **_) -> list:
    return cache_renderables(lab)


@data.register(CacheLab)
def _cache_data(lab, **_) -> dict:
    return cache_data(lab)


import mha_trace.render.cache_slide  # noqa: E402,F401 (registers the slide of what this file shows)
