"""The ablate view (`mha-trace ablate`, `mha_trace.ablate`, `Model.ablate`, `Model.rank`,
`Model.prune`, the explorer): the output with heads removed from a config's run or a model, every
head of a model ranked by its effect, or a causal model pruned head by head. One request; its
clashes declared as data and judged before torch."""

from dataclasses import dataclass, field

from mha_trace.core.clashes import judge, within
from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions

FOREIGN = ("ablate zeroes a head's slice of the concatenation inside the lecture's module, and a "
           "foreign class's concatenation cannot be reached from outside; verify --module checks "
           "your class against that module instead")
CLASHES = (within("module", ("module",), FOREIGN),
           within("prune", ("sentence", "layer"), "--prune runs on the bundled corpus, not on one "
                                                  "sentence or layer"))


@dataclass(frozen=True)
class AblateRequest:
    source: RunOptions = field(default_factory=RunOptions)
    removed: str | list | tuple | None = None  # a config's heads from 1; a model's "L.H"; "1,3"
    rank: bool = False  # a model: every head removed on its own, ranked
    prune: bool = False  # a causal model: heads removed least important first, the loss each step

    def check(self) -> None:
        """What the options alone decide, before torch."""
        o = self.source
        judge({"module": o.module, "prune": self.prune, "sentence": o.sentence,
               "layer": o.layer}, CLASHES)
        if not o.model:
            from mha_trace.runs.model_options import needs_model

            needs_model(None, None, rank=self.rank, prune=self.prune)
        elif sum((bool(self.named()), self.rank, self.prune)) > 1:
            raise MhaError("choose one of --head, --rank and --prune")
        elif not (self.named() or self.rank or self.prune):
            raise MhaError("with --model, name the heads to remove, e.g. --head 6.12 (or rank "
                           "them all with --rank, or prune them with --prune)", quantity="head")

    def named(self) -> list[str]:
        """The heads named, as text: "6.12,3.1" or ["6.12", "3.1"] or [1, 3]."""
        from mha_trace.runs.values import names

        if self.removed is None or self.removed in ((), []):
            return []
        texts = ([str(h) for h in self.removed] if isinstance(self.removed, (list, tuple)) else
                 names(self.removed, "head") if isinstance(self.removed, str) else [str(self.removed)])
        return [t.strip() for t in texts if t.strip()]


def ablate_view(r: AblateRequest, bar=None):
    """The Ablation, HeadRanking or Pruning the request asks for; `bar(total, what)` the progress
    bar of a ranking or a pruning."""
    from mha_trace.runs.resolve import check_early, resolve
    from mha_trace.views.source import no_bar

    config = check_early(r.source)  # before torch: a wrong flag is refused at once
    r.check()
    if r.source.model:
        return _from_model(r, bar or no_bar)
    from mha_trace.core.picks import check_picks
    from mha_trace.runs.values import whole_numbers

    if r.removed is not None and not r.named():
        raise MhaError("needs at least one number, e.g. 1,2,4", quantity="head")
    removed = whole_numbers(_numbers(r.named() or ["2"]), "head")
    check_picks(config, removed)
    from mha_trace.analyses.analysis import ablate_heads
    import mha_trace.render.ablate  # noqa: F401 (the renderers of what it returns)

    return ablate_heads(resolve(r.source, "config"), removed)


def _numbers(texts: list[str]) -> list[int]:
    try:
        return [int(t) for t in texts]
    except ValueError:
        hint = " (LAYER.HEAD goes with --model)" if any("." in t for t in texts) else ""
        raise MhaError(f"expected comma-separated integers like 1,2,4, got '{','.join(texts)}'"
                       f"{hint}", quantity="head") from None


def _from_model(r: AblateRequest, bar):
    from mha_trace.runs.model_options import check_picks_early
    from mha_trace.runs.resolve import load, resolve
    from mha_trace.views.source import model_named

    o = r.source
    if not r.prune:
        check_picks_early(model_named(o), o.layer, ",".join(r.named()) or None)
    import mha_trace.render.ablate  # noqa: F401 (the renderers of what it returns)
    import mha_trace.render.model  # noqa: F401
    import mha_trace.render.pruning  # noqa: F401
    if r.prune:
        from mha_trace.analyses.pruning import check_prunable, prune, steps
        from mha_trace.models import corpus

        m = load(o)
        check_prunable(m)
        c = corpus.bundled()
        with bar(steps(m, c), "ranking the heads, then removing them") as advance:
            return prune(m, c, advance)
    run = resolve(o)
    if r.rank:
        from mha_trace.analyses.model_analysis import rank_heads

        with bar(run.sentence.model.layers, "ranking heads (one batch per layer)") as advance:
            return rank_heads(run.sentence, advance)
    from mha_trace.analyses.model_analysis import ablate_model_heads
    from mha_trace.views.source import model_heads_named

    return ablate_model_heads(run.sentence, model_heads_named(run.sentence.model, ",".join(r.named())))
