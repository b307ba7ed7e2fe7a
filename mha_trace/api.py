"""The Python API: the functions the CLI itself calls, for notebooks and scripts.

    import mha_trace
    t = mha_trace.trace(module, x)            # any nn.Module and its forward arguments
    mha_trace.trace_sizes(d_model=512, heads=8)  # the built-in module, like `mha-trace shapes`
    t                                          # Jupyter: the shapes table as HTML; terminal: rich
    t.steps[3].shape, t.to_json()
    h = mha_trace.heads("cat-sat-on-mat")     # a bundled name, a path, or a Config
    mha_trace.explain(h, token="cat")         # renders like `mha-trace explain --token cat`

Every result is a dataclass that renders itself (`__rich_console__`, `_repr_html_`, `str`) and
gives its JSON (`data()`, `to_json()`).
"""

from dataclasses import dataclass

from mha_trace.analysis import Ablation, HeadsView, Walk, analyse, find_position, walk
from mha_trace.analysis import ablate as _ablate
from mha_trace.analysis import compare as _compare
from mha_trace.config import Config, load
from mha_trace.output import Shows
from mha_trace.run import Run, Sizes
from mha_trace.shapes import ShapesReport, trace_run

_HEADS_NAMES = ("heads", "num_heads", "n_head", "n_heads", "nhead", "num_attention_heads")


def trace(module, *args, **kwargs) -> ShapesReport:
    """Run `module(*args, **kwargs)` once under the tracer: every tensor op, its shape and memory.
    A NumPy implementation (a class with forward) is traced array op by array op.

    >>> t = trace(torch.nn.MultiheadAttention(64, 4, batch_first=True), x, x, x)
    >>> t.steps[0].shape
    (2, 10, 64)
    """
    import torch

    import numpy as np

    first = next((a for a in args if isinstance(a, (torch.Tensor, np.ndarray))), None)
    if isinstance(first, np.ndarray):
        first = torch.from_numpy(np.asarray(first))[None] if first.ndim == 2 else torch.from_numpy(first)
    shape = tuple(first.shape) if first is not None and first.dim() == 3 else (1, 1, 1)
    heads = next((getattr(module, n) for n in _HEADS_NAMES if isinstance(getattr(module, n, None), int)), 1)
    sizes = Sizes(*shape, heads=heads, dtype=str(first.dtype).removeprefix("torch.") if first is not None
                  else "float32", device=first.device.type if first is not None else "cpu")
    names = ", ".join(["x"] * len(args) + list(kwargs))
    import inspect

    run = Run(module, args, kwargs, sizes, label=type(module).__name__, call=f"forward({names})",
              source=inspect.getsourcefile(type(module)) or "?")
    return trace_run(run)


def trace_sizes(**sizes) -> ShapesReport:
    """The built-in module at these sizes, traced: like `mha-trace shapes` with the same flags.

    >>> trace_sizes(d_model=512, heads=8, mask="causal").largest.shape
    (2, 8, 10, 10)
    """
    from mha_trace.run import from_sizes

    return trace_run(from_sizes(Sizes(**sizes)))


def _config(config: str | Config | None, **overrides) -> Config:
    c = config if isinstance(config, Config) else load(config)
    return c.with_overrides(**overrides) if any(v is not None for v in overrides.values()) else c


def heads(config: str | Config | None = None, *, heads: int | None = None,
          kv_heads: int | None = None, mask: str | None = None, pad: int | None = None) -> HeadsView:
    """Every head's weights for a config: a bundled name, a path to a TOML file, or a Config."""
    return analyse(_config(config, heads=heads, kv_heads=kv_heads, mask=mask, pad=pad))


def explain(view: HeadsView | str | Config | None = None, token: str | None = None,
            position: int | None = None) -> Walk:
    """One token through every head, every product written out (`mha-trace explain`)."""
    view = view if isinstance(view, HeadsView) else heads(view)
    return walk(view, find_position(view.tokens, token, position))


def ablate(config: str | Config | None = None, removed=(2,)) -> Ablation:
    """The output with the given heads (1-based) zeroed before W_O, and how far each token moved."""
    return _ablate(_config(config), list(removed))


@dataclass
class Comparison(Shows):
    """The same input split into several head counts."""

    views: list[HeadsView]

    def renderables(self, width: int = 100, decimals: int = 4) -> list:
        from mha_trace.render.compare import compare_renderables

        return compare_renderables(self.views, decimals)

    def data(self, decimals: int = 4) -> dict:
        from mha_trace.render.compare import compare_data

        return compare_data(self.views, decimals)


def compare(config: str | Config | None = None, head_counts=(1, 2, 4)) -> Comparison:
    """The same Q, K, V split into each head count (`mha-trace compare --heads 1,2,4`)."""
    return Comparison(_compare(_config(config), list(head_counts)))
