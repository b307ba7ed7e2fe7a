"""A walk shown another way: its row through FlashAttention-2's loop, or its scores split by
RoPE's rotation planes (the API's `explain(impl=..., rope_planes=...)`). Which ways go together
is the explain view's to judge (`views.explain`), before the walk is made."""


def shown_as(w, impl: str, block_k: int | None, rope_planes: bool):
    """The walk as it is, its row through FlashAttention-2's loop (impl="tiled"), or its scores
    split by RoPE's planes (rope_planes=True)."""
    if rope_planes:
        from mha_trace.analyses.rope_planes import rope_planes as split

        return split(w)
    if impl == "explicit":
        return w
    from mha_trace.analyses.tiled_walk import tiled_walk

    return tiled_walk(w, block_k)
