"""The explain view (`mha-trace explain`, `mha_trace.explain`, `Model.explain`, the explorer):
one token through every head of a config, a module, a model's layer or Whisper's cross-attention,
shown whole, tiled or by RoPE plane, split by source (`--why`). One request; which options go
together declared as data and judged before torch, in one wording for every front end."""

from dataclasses import dataclass, field

from mha_trace.core.clashes import apart, judge, needs, within
from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions

HEARD_SAYS = ("with --audio, explain follows one token through every cross-attention head: "
              "--token or --position, and --effect, or --why with --head L.H (--attention self: "
              "every option, on the decoder's self-attention)")
HEARD = (within("audio", ("by_head", "include_inputs", "impl=tiled", "rope_planes", "layer",
                         "head_without_why", "why_without_head", "why_with_effect"), HEARD_SAYS),)

SHOWN_AS = (apart("rope_planes", ("impl=tiled",), "it splits the explicit walk's scores"),
            needs("block_k", "impl=tiled", "sets the key tiles of the tiled walk"),
            apart("impl=tiled", ("why", "effect", "module"),
                  "the tiled walk shows the online softmax alone"),
            apart("rope_planes", ("why", "effect", "module"), "the planes are shown alone"),
            needs("by_head", "why", "splits the sources --why finds"))


SCORED = (apart("why", ("qk_norm", "alibi", "relative_bias", "softcap", "sink_logits", "off_by_one"),
                 "--why splits q·k into sums by source; QK-norm's division, a position bias, the cap's "
                 "tanh and the sink's column are not parts of q·k"),
          apart("impl=tiled", ("alibi", "relative_bias", "softcap", "sink_logits", "off_by_one"),
                "the tiled walk is the plain online softmax"),
          apart("rope_planes", ("alibi", "relative_bias", "softcap", "sink_logits", "off_by_one"),
                "the planes split q·k, not what the cap or the sink makes of it"),
          apart("rope_dim", ("rope_planes",), "the planes split heads that RoPE turns whole"),
          apart("latent", ("why", "impl=tiled", "rope_planes"),
                "MLA's walk splits each score into its content part and its RoPE part"))


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


@dataclass(frozen=True)
class ExplainRequest:
    source: RunOptions = field(default_factory=RunOptions)
    token: str | None = None
    position: int | None = None
    head: str | int | None = None  # a config's head from 1; a model's "L.H" (its layer too)
    effect: bool = False
    why: bool = False
    by_head: bool = False
    impl: str = "explicit"  # or "tiled": the row through FlashAttention-2's loop
    block_k: int | None = None
    rope_planes: bool = False
    include_inputs: bool = False

    def check(self) -> None:
        """What the options alone decide, before torch."""
        o = self.source
        check_shown_as(self.impl, self.block_k, self.why, self.effect, o.module, self.rope_planes,
                       self.by_head)
        judge({"why": self.why, "impl=tiled": self.impl == "tiled", "rope_planes": self.rope_planes,
               "qk_norm": o.qk_norm, "alibi": o.alibi, "relative_bias": o.relative_bias, "softcap": o.softcap,
               "sink_logits": o.sink_logits,
               "off_by_one": o.off_by_one, "latent": o.latent, "rope_dim": o.rope_dim}, SCORED)
        if self.position is not None:
            from mha_trace.runs.values import whole_numbers

            whole_numbers([self.position], "position", least=0)
        if o.audio is not None and o.attention != "self":
            judge({"audio": True, "by_head": self.by_head, "include_inputs": self.include_inputs,
                   "impl=tiled": self.impl == "tiled", "rope_planes": self.rope_planes,
                   "layer": o.layer, "head_without_why": self.head is not None and not self.why,
                   "why_without_head": self.why and self.head is None,
                   "why_with_effect": self.why and self.effect}, HEARD)
        if not (o.model or o.audio is not None) and self.by_head:
            raise MhaError("--by-head splits a model's earlier layers into their heads; a "
                           f"{'module' if o.module else 'config'}'s scores split into the head's "
                           "dims", quantity="by_head")


def explain_view(r: ExplainRequest):
    """One token through the heads the request names: a Walk (or its tiled row, or its scores by
    RoPE plane), a module's ModuleWalk, or Whisper's cross-attention and encoder walks."""
    from mha_trace.views.source import checked_picks

    config, head = checked_picks(r)
    o = r.source
    if not o.model:  # a config's token and head, checked before torch
        from mha_trace.core.picks import check_picks

        check_picks(config, [head], r.token, r.position)
    import mha_trace.render.alignment  # noqa: F401 (the renderers of what it returns)
    import mha_trace.render.explain  # noqa: F401
    import mha_trace.render.frame_why  # noqa: F401
    import mha_trace.render.rope_planes  # noqa: F401
    import mha_trace.render.tiled_walk  # noqa: F401
    if o.audio is not None and o.attention != "self":
        return _heard(o, o.audio, r, head)
    if o.module:
        return _module_walk(r, head)
    run, w, only = _model_walk(r, head) if o.model else _config_walk(r, head)
    if r.impl == "tiled" or r.rope_planes:
        from mha_trace.analyses.variants import shown_as

        return attach(shown_as(w, r.impl, r.block_k, r.rope_planes), run, r)
    if r.why:
        from mha_trace.analyses.why import with_why

        w = with_why(w, run, only, r.by_head)
    return attach(w, run, r)


def attach(record, run, r: ExplainRequest):
    from mha_trace.views.source import attach_inputs

    return attach_inputs(record, run, r.include_inputs)


def _config_walk(r: ExplainRequest, head: int | None):
    """A config's run, or sizes': (the run, its walk, the head)."""
    from dataclasses import replace

    from mha_trace.analyses.analysis import LectureHeads, run_heads
    from mha_trace.analyses.walk import walk
    from mha_trace.core.picks import find_position
    from mha_trace.runs.resolve import resolve

    run = resolve(r.source)
    view = run_heads(run, head, r.effect)
    if not isinstance(view, LectureHeads):  # a run of the lecture's module is walked by hand
        raise MhaError("explain walks the lecture's module's q, k and v", quantity="module")
    return run, replace(walk(view, find_position(view.tokens, r.token, r.position)), only=head), head


def _module_walk(r: ExplainRequest, head: int | None):
    """The user's module: its weights from the softmax on (its projections are its own)."""
    from mha_trace.analyses.analysis import run_heads
    from mha_trace.analyses.walk import ModuleWalk
    from mha_trace.core.picks import find_position
    from mha_trace.runs.resolve import resolve

    run = resolve(r.source)
    view = run_heads(run, head, r.effect)
    i = find_position(view.tokens, r.token, r.position)
    found = None
    if r.why:
        from mha_trace.analyses.why import module_why

        found = module_why(run, view, i, [head] if head else list(range(1, view.heads + 1)))
    return attach(ModuleWalk(view, i, head, found), run, r)


def _model_walk(r: ExplainRequest, head):
    """A model's layer (--head L.H names it, else --layer, else 1): (the run, the walk, the head)."""
    from dataclasses import replace

    from mha_trace.analyses.model_heads import head_in_layer, model_walk
    from mha_trace.runs.resolve import resolve

    layer, only = head_in_layer(r.source.layer, head)
    run = resolve(replace(r.source, layer=layer))
    return run, replace(model_walk(run, only, r.token, r.position, r.effect), only=only), only


def _heard(o: RunOptions, audio: str, r: ExplainRequest, head):
    """Whisper: one written token's query in every cross-attention head (or, --attention
    encoder, one frame's in the encoder's); with --why and --head L.H, that head's scores split
    by where q and k come from."""
    from mha_trace.runs.resolve import load
    from mha_trace.views.source import model_heads_named

    model = load(o)
    heard = model.heard_file(audio)  # the recording, read and transcribed once
    if r.why:
        from mha_trace.analyses.frame_why import cross_why, encoder_why

        explained = encoder_why if o.attention == "encoder" else cross_why
        return explained(model, heard, r.token, r.position, model_heads_named(model, head)[0])
    if o.attention == "encoder":
        from mha_trace.analyses.encoder import listen_frame

        return listen_frame(model, heard, r.token, r.position, r.effect)
    from mha_trace.analyses.alignment import listen

    return listen(model, heard, r.token, r.position, r.effect)
