"""The records every command and the API return, and the registry that shows them.

A record is plain data (a dataclass deriving from `Shows`). How it looks is registered here by
its renderer (`mha_trace/render/`, one file per command: `@renderables.register(Heads)`), so a
record never imports a renderer and this module sits below both. A renderer registers when it is
imported, and the view that returns a record imports its renderer (`mha_trace/views/`): every
front end gets its records through a view.
"""

import io
from functools import singledispatch

from rich.console import Console
from rich.text import Text

from mha_trace.errors import MhaError
from mha_trace.io.notebook_html import WIDE, to_html
from mha_trace.io.output import PLAIN_WIDTH, titled_parts, to_json
from mha_trace.io.page import in_notebook, notebook_figure


NO_RENDERER = ("no renderer is registered for {}: the view that returns it imports its renderer "
               "(mha_trace/views/)")


@singledispatch
def renderables(record, width: int, **options) -> list:
    """What the CLI prints for `record` (rich renderables), laid out for `width` columns."""
    raise TypeError(NO_RENDERER.format(type(record).__name__))


@singledispatch
def data(record, **options) -> dict:
    """`record` as the CLI's --format json gives it (without schema_version)."""
    raise TypeError(NO_RENDERER.format(type(record).__name__))


class Shows:
    """A record shown in a terminal (rich), in Jupyter (HTML) and as JSON.

    `renderables(width, **options)` (rich renderables, as the CLI prints them) and
    `data(**options)` (the JSON of --format json, without schema_version) come from the renderer
    registered for the record's type (below): records never import renderers.
    """

    inputs: dict | None = None  # the run's inputs and weights, when a view was asked for them

    def renderables(self, width: int = PLAIN_WIDTH, **options) -> list:
        return renderables(self, width, **options)

    def data(self, **options) -> dict:
        shown = data(self, **options)
        return shown if self.inputs is None else {**shown, "inputs": self.inputs}

    def to_json(self) -> str:
        return to_json(self.data())

    def __rich_console__(self, console, options):
        for i, r in enumerate(self.renderables(options.max_width)):
            if i:
                yield Text("")
            yield from titled_parts(r)

    def _repr_html_(self) -> str:
        """Jupyter: the interactive view where the record has one (heads, a walk, a trace), then
        real HTML tables, laid out without a width limit (shown once: nothing here prints to the
        notebook)."""
        try:
            view = in_notebook(self)
        except (TypeError, MhaError):  # no interactive view of this record, or one too large
            view = ""
        if view and not getattr(self, "tables_in_notebook", True):
            return f'<div class="mha-trace">{view}</div>'  # a model's overview: the view is all
        shown = to_html(self.renderables(WIDE)).replace(">", ">" + view, 1)
        try:
            return shown + notebook_figure(self)
        except TypeError:  # no figure for this record
            return shown

    def _repr_pretty_(self, printer, cycle) -> None:
        """IPython's plain-text form: the terminal text, not the dataclass's fields."""
        printer.text(str(self).rstrip("\n"))

    def __init_subclass__(cls, **kwargs):
        # IPython takes a class's own __repr__ (a dataclass writes one) before an inherited
        # _repr_pretty_, so every record carries its own
        super().__init_subclass__(**kwargs)
        cls._repr_pretty_ = Shows._repr_pretty_

    def __str__(self) -> str:
        console = Console(file=io.StringIO(), width=PLAIN_WIDTH, color_system=None,
                          force_jupyter=False, highlight=False, emoji=False, markup=False)
        with console.capture() as captured:
            console.print(self)
        return "".join(line.rstrip() + "\n" for line in captured.get().splitlines())
