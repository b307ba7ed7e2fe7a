"""The shapes view (`mha-trace shapes`, `mha_trace.trace_sizes`, `Model.trace`, the explorer):
one forward pass of the built-in module, a config, a module, a model's layer or Whisper's
attention, traced op by op; the lecture's eight rows (`compact`) or the explicit path beside the
fused or tiled one (`compare_impl`). One request; its clashes judged before torch."""

from dataclasses import dataclass, field, replace

from mha_trace.core.clashes import apart, judge
from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions

OTHER_SOURCE = "a pretrained model fixes its own sizes, weights and input"
CLASHES = (apart("compare_impl", ("model",), OTHER_SOURCE),
           apart("include_inputs", ("model",), OTHER_SOURCE),
           apart("compact", ("module", "decode", "latent"), "the lecture's eight steps are the built-in "
                                                            "module's, on one forward pass"))


@dataclass(frozen=True)
class ShapesRequest:
    source: RunOptions = field(default_factory=RunOptions)
    compact: bool = False
    compare_impl: bool = False
    include_inputs: bool = False

    def check(self) -> None:
        """What the options alone decide, before torch."""
        o = self.source
        judge({"model": o.model, "compare_impl": self.compare_impl, "module": o.module,
               "include_inputs": self.include_inputs, "compact": self.compact,
               "decode": o.decode or None, "latent": o.latent}, CLASHES)
        if self.compare_impl and o.impl not in ("sdpa", "tiled"):
            raise MhaError("--compare-impl goes with --impl sdpa or tiled (it compares that path "
                           "with the explicit one)", quantity="compare_impl")


def shapes_view(r: ShapesRequest):
    """The ShapesReport of the request's run, with the lecture's symbols or the explicit path."""
    from mha_trace.runs.resolve import check_early, resolve, symbols_probe
    from mha_trace.views.source import attach_inputs

    check_early(r.source, "sizes")  # before torch: a wrong flag is refused at once
    r.check()
    from mha_trace.analyses.shapes import shape_symbols, trace_run
    import mha_trace.render.shapes  # noqa: F401 (the renderers of what it returns)

    report = trace_run(resolve(r.source, "sizes"))
    if r.compact and not report.failure:
        report.symbols = shape_symbols(trace_run(symbols_probe(report.sizes)))
    if r.compare_impl:
        plain = replace(r.source, impl=None, block_q=None, block_k=None)
        report.explicit = trace_run(resolve(plain, "sizes"))
    return attach_inputs(report, report.run, r.include_inputs)


def call_view(module, args: tuple, kwargs: dict):
    """Any module or function (PyTorch or NumPy) called once on its arguments, traced op by op."""
    if not callable(module) and not hasattr(module, "forward"):
        raise MhaError(f"{module!r} is not a module or a function to run", quantity="module")
    from mha_trace.analyses.shapes import trace_run
    from mha_trace.runs.calls import from_call
    import mha_trace.render.shapes  # noqa: F401 (the renderers of what it returns)

    return trace_run(from_call(module, args, kwargs))
