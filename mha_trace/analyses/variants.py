"""A walk shown another way: its row through FlashAttention-2's loop, or its scores split by
RoPE's rotation planes (the API's `explain(impl=..., rope_planes=...)`)."""

from mha_trace.errors import MhaError


def shown_as(w, impl: str, block_k: int | None, explicit_only: bool, rope_planes: bool):
    """The walk as it is, its row through FlashAttention-2's loop (impl="tiled"), or its scores
    split by RoPE's planes (rope_planes=True)."""
    if rope_planes:
        if impl != "explicit" or explicit_only:
            raise MhaError("rope_planes=True splits the explicit walk's scores (not with why, "
                           "effect or impl='tiled')", quantity="rope_planes")
        from mha_trace.analyses.rope_planes import rope_planes as split

        return split(w)
    if impl not in ("explicit", "tiled"):
        raise MhaError(f"impl {impl!r} is not one of explicit, tiled (sdpa forms no weights to "
                       f"walk)", quantity="impl")
    if impl == "explicit":
        if block_k is not None:
            raise MhaError("block_k sets the key tiles of impl='tiled'", quantity="block_k")
        return w
    if explicit_only:
        raise MhaError("why and effect go with the explicit walk; impl='tiled' shows the online "
                       "softmax alone", quantity="impl")
    from mha_trace.analyses.tiled_walk import tiled_walk

    return tiled_walk(w, block_k)
