"""The explain view's ways to show a walk (`explain --impl tiled`, `--rope-planes`, `--why`):
which go together, declared as data and judged before torch, in one wording for the command
line and the Python API (`explain(...)`, `model(...).explain(...)`)."""

from mha_trace.core.clashes import apart, judge, needs
from mha_trace.errors import MhaError

SHOWN_AS = (apart("rope_planes", ("impl=tiled",), "it splits the explicit walk's scores"),
            needs("block_k", "impl=tiled", "sets the key tiles of the tiled walk"),
            apart("impl=tiled", ("why", "effect", "module"),
                  "the tiled walk shows the online softmax alone"),
            apart("rope_planes", ("why", "effect", "module"), "the planes are shown alone"),
            needs("by_head", "why", "splits the sources --why finds"))


def check_shown_as(impl: str, block_k=None, why: bool = False, effect: bool = False,
                   module=None, rope_planes: bool = False, by_head: bool = False) -> None:
    """The walk's way of showing, as the options alone decide it."""
    if impl not in ("explicit", "tiled"):
        raise MhaError(f"impl {impl!r} never forms the weights to walk: explicit or tiled"
                       if impl == "sdpa" else f"impl {impl!r} is not one of explicit, tiled",
                       quantity="impl")
    judge({"impl=tiled": impl == "tiled", "block_k": block_k, "why": why, "effect": effect,
           "module": module, "rope_planes": rope_planes, "by_head": by_head}, SHOWN_AS)
    if block_k is not None:
        from mha_trace.core.validate import positive

        positive("block_k", block_k)
