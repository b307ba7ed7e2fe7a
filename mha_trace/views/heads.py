"""The heads view (`mha-trace heads`, `mha_trace.heads`, `Model.heads`, the explorer): every
head's weights of a config, a module, a model's layer or whole model, or Whisper's cross-attention
and encoder heads. One request; its clashes declared as data and judged before torch."""

from dataclasses import dataclass, field

from mha_trace.core.clashes import apart, judge, needs, within
from mha_trace.runs.resolve import RunOptions

MODEL_ONLY = "shows a model's heads: add --model (e.g. --model minilm)"
HEARD = ("with --audio, heads shows the cross-attention heads: every one, or --head L.H alone "
         "(e.g. --head 4.3; survey --model whisper --audio FILE ranks them all; --attention "
         "self: every view of the decoder's self-attention)")

CLASHES = (within("audio", ("overview=head", "words", "hide_special", "include_inputs", "concat",
                             "effect", "layer"), HEARD),
           needs("overview", "model", MODEL_ONLY), needs("words", "model", MODEL_ONLY),
           needs("hide_special", "model", MODEL_ONLY),
           apart("concat", ("model",), "a model's layer shows each head; --concat is the lecture "
                                       "module's concatenation"),
           needs("concat", "head", "shows the concatenation beside one head (without --head "
                                   "every head, the concatenation and the output are shown)"))


@dataclass(frozen=True)
class HeadsRequest:
    source: RunOptions = field(default_factory=RunOptions)
    head: str | int | None = None  # a config's head from 1; a model's "L.H"
    overview: bool = False
    words: bool = False
    hide_special: bool = False
    effect: bool = False
    concat: bool = False  # shown beside --head: the check is the view's, the table the renderer's
    include_inputs: bool = False

    def check(self) -> None:
        """What the options alone decide, before torch."""
        o = self.source
        heard = o.audio is not None and o.attention != "self"
        judge({"overview": self.overview, "words": self.words, "hide_special": self.hide_special,
               "concat": self.concat, "head": self.head, "model": o.model, "effect": self.effect,
               "include_inputs": self.include_inputs, "layer": o.layer, "audio": heard,
               "overview=head": self.overview and self.head is not None}, CLASHES)


def heads_view(r: HeadsRequest):
    """The record of every head the request asks for (its `inputs` attached when asked)."""
    from mha_trace.runs.resolve import resolve
    from mha_trace.views.source import attach_inputs, checked_picks

    _, head = checked_picks(r)
    import mha_trace.render.alignment  # noqa: F401 (the renderers of what it returns)
    import mha_trace.render.heads  # noqa: F401
    import mha_trace.render.model  # noqa: F401
    o = r.source
    if o.audio is not None and o.attention != "self":
        return _heard(o, o.audio, head)
    if o.model:
        from mha_trace.analyses.model_heads import check_not_overview, model_heads

        view = model_heads(resolve(o), o.layer, head, r.words, r.hide_special, r.effect)
        check_not_overview(view, r.overview)
        return view
    from mha_trace.analyses.analysis import run_heads

    run = resolve(o)
    return attach_inputs(run_heads(run, head, r.effect), run, r.include_inputs)


def _heard(o: RunOptions, audio: str, head: str | None):
    """Whisper's cross-attention heads (or, --attention encoder, its encoder's), tokens × time."""
    from mha_trace.runs.resolve import load
    from mha_trace.views.source import model_heads_named

    model = load(o)
    named = model_heads_named(model, head)
    chosen = named[0] if named else None
    if o.attention == "encoder":
        from mha_trace.analyses.encoder import encoder_heads

        return encoder_heads(model, model.heard_file(audio), chosen)
    from mha_trace.analyses.alignment import cross_heads

    return cross_heads(model, model.heard_file(audio), chosen)
