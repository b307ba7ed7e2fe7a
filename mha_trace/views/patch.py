"""The patch view (`mha-trace patch`, `Model.patch`): activation patching over both grids, or
path patching from sender heads to a receiver. One request; its clashes declared as data and
judged before torch; one function that both front ends call."""

from dataclasses import dataclass, field

from mha_trace.core.clashes import apart, judge, together
from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions

CLASHES = (together("clean", "corrupt", "or neither: the default pair"),
           together("sender", "receiver", "path patching"),
           apart("sender", ("by_input", "by_position"),
                 "--by-input and --by-position patch every head; path patching follows one path"))


@dataclass(frozen=True)
class PatchRequest:
    source: RunOptions = field(default_factory=lambda: RunOptions(model="smollm2"))
    clean: str | None = None
    corrupt: str | None = None
    metric: str | None = None  # None: the model's default ("" is a metric nobody chose: refused)
    noising: bool = False
    sender: str | None = None  # "1.1" or "1.1,1.2" (several, patched together)
    receiver: str | None = None
    by_input: bool = False
    by_position: str | None = None  # "24.1"

    def check(self) -> None:
        """What the options alone decide, before torch and the model load."""
        judge({k: v for k, v in vars(self).items() if k != "source"}, CLASHES)
        if self.metric is not None and (not isinstance(self.metric, str) or not self.metric.strip()):
            raise MhaError(f"metric {self.metric!r} is not 'loss', 'logit-diff:A,B' or, with "
                           f"--receiver, 'induction'", quantity="metric")
        for name in ("clean", "corrupt"):
            text = getattr(self, name)
            if text is not None and (not isinstance(text, str) or not text.strip()):
                raise MhaError(f"{name} text is empty: give a text to run", quantity=name)
        for name in ("sender", "receiver", "by_position"):
            if len(self.heads(name)) > 1 and name != "sender":
                raise MhaError(f"{name} is one head, LAYER.HEAD (several senders may share it)",
                               quantity=name)

    def heads(self, name: str) -> list[tuple[int, int]]:
        """The (layer, head) pairs an option names, each LAYER.HEAD."""
        from mha_trace.models.guards import parse_head

        value = getattr(self, name)
        if value is None:
            return []
        parts = value if isinstance(value, (list, tuple)) else str(value).split(",")
        return [parse_head(str(part).strip(), name) for part in parts]


def patch_view(request: PatchRequest, bar=None):
    """The record the request asks of its model: `Patching` (both grids) or `PathPatching`;
    `bar(total, what)` the progress bar of the layers patched."""
    from mha_trace.analyses.patch_inputs import default_pair, parse_metric
    from mha_trace.runs.resolve import check_options, load, with_checkpoint
    from mha_trace.views.source import no_bar

    request.check()  # the options first, before torch and the model load
    o = with_checkpoint(request.source)
    check_options(o)
    from mha_trace.runs.model_options import check_picks_early
    from mha_trace.views.source import model_named

    for name in ("sender", "receiver", "by_position"):  # by the sizes the model declares
        value = getattr(request, name)
        listed = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else value
        check_picks_early(model_named(o), None, listed, name)
    import mha_trace.render.patching  # noqa: F401 (the renderers of what it returns)
    model = load(o)
    clean, corrupt, metric = default_pair(model, path=request.sender is not None)
    if request.clean is not None and request.corrupt is not None:  # both or neither: checked
        clean, corrupt = request.clean, request.corrupt
    chosen = parse_metric(model, metric if request.metric is None else request.metric)
    if request.sender is not None:
        from mha_trace.analyses.path_patching import path_patch

        return path_patch(model, clean, corrupt, chosen, request.heads("sender"),
                          request.heads("receiver")[0], bool(request.noising))
    from mha_trace.analyses.patching import patch

    at = request.heads("by_position")
    with (bar or no_bar)(model.layers, "patching, layer by layer") as advance:
        return patch(model, clean, corrupt, chosen, bool(request.noising), advance,
                     bool(request.by_input), at[0] if at else None)
