"""The compare view (`mha-trace compare`, `mha_trace.compare`): the same Q, K, V split into each
head count, side by side."""

from dataclasses import dataclass, field

from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions


@dataclass(frozen=True)
class CompareRequest:
    source: RunOptions = field(default_factory=RunOptions)
    head_counts: str | list | tuple = (1, 2, 4)  # "1,2,4" or [1, 2, 4]

    def counts(self) -> list[int]:
        """The head counts, each a whole number from 1."""
        from mha_trace.runs.values import whole_numbers

        counts = self.head_counts
        if isinstance(counts, str):
            try:
                counts = [int(part) for part in counts.split(",")] if counts.strip() else []
            except ValueError:
                raise MhaError(f"expected comma-separated integers like 1,2,4, got '{counts}'",
                               quantity="heads") from None
        if not counts:
            raise MhaError("needs at least one number, e.g. 1,2,4", quantity="heads")
        return whole_numbers(counts, "head_counts", least=0)  # 0: refused as no divisor of d_model


def compare_view(r: CompareRequest):
    """A Comparison: one Heads a head count, on the config's run."""
    if r.source.module:
        raise MhaError("compare re-splits one set of projections into other head counts, which "
                       "only the lecture's module exposes; for your class, run heads --module "
                       "once per head count (--heads 1, 2, 4)", quantity="module")
    from mha_trace.runs.resolve import resolve_splits

    runs = resolve_splits(r.source, r.counts())  # the checks before torch, then the runs
    from mha_trace.analyses.analysis import Comparison, analyse_splits
    import mha_trace.render.compare  # noqa: F401 (the renderers of what it returns)

    return Comparison(analyse_splits(runs))
