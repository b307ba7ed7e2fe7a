"""What a sliding window keeps, and the layers that have one: the band of scores a window (and
StreamingLLM's sinks beside it) leaves each query, which layers of a local/global pattern are local
(Gemma 2, Gemma 3, gpt-oss), and the tokens a whole KV cache holds over them. Plain arithmetic, no
torch (`cost` reads it)."""

from mha_trace.errors import MhaError


def band(T: int, W: int, S: int = 0) -> int:
    """Scores a sliding window of W keeps over T tokens: query i sees min(i + 1, W) keys, so
    Σᵢ min(i + 1, W) = W(W + 1)/2 + (T − W)·W, and the causal triangle T(T + 1)/2 when W ≥ T;
    with S sinks (StreamingLLM), also the first S tokens once the window has left them:
    Σᵢ min(S, i + 1 − W) over the queries i ≥ W."""
    W = min(W, T)
    beyond, S = T - W, min(S, T - W)  # queries whose window has left the first token
    kept = S * (S + 1) // 2 + (beyond - S) * S  # Σ min(S, n) for n = 1 .. beyond
    return W * (W + 1) // 2 + (T - W) * W + kept


def layer_kinds(d, L: int) -> tuple[int, int]:
    """(local, global) layers of L: each cycle's local (windowed) layers first, as Gemma 2 and
    gpt-oss alternate from a local first layer and Gemma 3 runs five local layers to a global one;
    without a pattern every layer is local under a window, else global."""
    if d.local_global is None:
        return (L, 0) if d.window is not None else (0, L)
    local, every = d.local_global
    cycles, rest = divmod(L, local + every)
    n_local = cycles * local + min(rest, local)
    return n_local, L - n_local


def cached_tokens(d, L: int) -> tuple[str, str, str, int]:
    """(the row's name, the token-layers a whole cache holds in symbols and in numbers, their
    count, the batch's rows included): T a layer; a window's layers min(T, W) (and the S sinks
    beside it); local and global layers each theirs."""
    T, B = d.seq, d.batch
    if d.window is None:
        return "KV cache, batch × seq × layers", "L·B·T", f"{L}·{B}·{T}", L * B * T
    kept, kept_n = ("min(T, W + S)", min(T, d.window + d.sinks)) if d.sinks else ("min(T, W)", min(T, d.window))
    n_local, n_global = layer_kinds(d, L)
    if d.local_global is None:
        return (f"KV cache, batch × layers × {kept_n} tokens (window)", f"L·B·{kept}",
                f"{L}·{B}·{kept_n}", L * B * kept_n)
    return (f"KV cache ({n_local} local layers × {kept_n}, {n_global} global × {T})",
            f"B·(L_local·{kept} + L_global·T)", f"{B}·({n_local}·{kept_n} + {n_global}·{T})",
            B * (n_local * kept_n + n_global * T))


def window_options(pick, head_dim, local_global, sinks, sink_logits, window) -> dict:
    """A head's width, local and global layers and sinks: each given, or the preset's, checked."""
    from mha_trace.core.validate import positive

    head_dim = pick(head_dim, "head_dim", None)
    if head_dim is not None:
        positive("head_dim", head_dim)
    pattern = pick(local_global, "local_global", None)
    if isinstance(pattern, str):
        parts = pattern.split(":")
        if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
            raise MhaError(f"{pattern!r} is not LOCAL:GLOBAL layers a cycle, e.g. 5:1 (Gemma 3) or 1:1",
                           quantity="local_global")
        pattern = tuple(int(p) for p in parts)
    sinks = pick(sinks, "sinks", 0)
    if pattern is not None and (len(pattern) != 2 or min(pattern) < 1):
        raise MhaError(f"{pattern} is not LOCAL:GLOBAL layers a cycle, each at least 1", quantity="local_global")
    if type(sinks) is not int or sinks < 0:
        raise MhaError(f"sinks={sinks!r} is not a number of first tokens kept (0 or more)", quantity="sinks")
    for name, given in (("local_global", pattern), ("sinks", sinks or None)):
        if given is not None and window is None:
            raise MhaError(f"--{name.replace('_', '-')} describes the layers a sliding window has: add "
                           f"--window W", quantity=name)
    return {"head_dim": head_dim, "local_global": None if pattern is None else tuple(pattern),
            "sinks": sinks, "sink_logits": bool(pick(sink_logits, "sink_logits", False))}
