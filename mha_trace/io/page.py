"""The interactive page: one self-contained HTML file for `--html` and for Jupyter.

A record (Heads, Walk, ShapesReport) becomes plain data through `page_data`, which the renderers
in `mha_trace/render/page.py` register for their records, and the data goes into one page with the
front-end code of `mha_trace/web/` inline: no CDN, no fetch, nothing outside the file. Text
reaches the page only as JSON and the page only ever writes it as text, so a token such as
`<script>` shows as itself.
"""

import html
import json
from functools import singledispatch
from pathlib import Path

WEB = Path(__file__).resolve().parent.parent / "web"


def page(record) -> str:
    """The whole page for a record."""
    data = page_data(record)
    css, js = ((WEB / name).read_text("utf-8") for name in ("page.css", "page.js"))
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"),
                         allow_nan=False).replace("<", "\\u003c")  # strict: JSON.parse must read it
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{html.escape(data['title'])}</title><style>{css}</style></head>"
            "<body><main id=\"mha\"></main>"
            f"<script type=\"application/json\" id=\"mha-data\">{payload}</script>"
            f"<script>{js}</script></body></html>\n")


def in_notebook(record, height: int = 560) -> str:
    """The page in an iframe of its own (scripts run there, isolated from the notebook's)."""
    return (f'<iframe class="mha-trace" sandbox="allow-scripts" style="width:100%;height:{height}px;'
            f'border:1px solid #8884" srcdoc="{html.escape(page(record), quote=True)}"></iframe>')


@singledispatch
def page_data(record) -> dict:
    raise TypeError(f"no interactive page for {type(record).__name__}")


@singledispatch
def slide(record, path: str, theme: str = "light", **options) -> None:
    """`--png`: the record drawn on a 1920×1080 slide at `path`. Each record type registers its
    slide (`mha_trace/render/*_slide.py`) like its page; options a slide may read: `decimals`,
    `head` (the head the command was asked for), `scale` (the top of the colour scale)."""
    raise TypeError(f"no slide for {type(record).__name__}")


@singledispatch
def notebook_figure(record) -> str:
    """An <img> a record shows in Jupyter under its tables (a training run's curves), or a
    TypeError when it has none (or matplotlib is not installed)."""
    raise TypeError(f"no figure for {type(record).__name__}")


def in_a_kernel() -> bool:
    """Whether this runs in a Jupyter kernel (IPython is only looked at when already loaded)."""
    import sys

    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


class NotebookProgress:
    """A progress bar in a Jupyter cell (one display, updated in place); nothing elsewhere."""

    def __init__(self, total: int, what: str):
        self.total, self.what, self.done, self.handle = total, what, 0, None
        if in_a_kernel() and total > 0:
            from IPython.display import HTML, display

            self.handle = display(HTML(self._html("")), display_id=True)

    def _html(self, note: str) -> str:
        return (f'<div class="mha-trace"><progress value="{self.done}" max="{self.total}"></progress>'
                f' {html.escape(self.what)} {self.done}/{self.total} {html.escape(note)}</div>')

    def advance(self, note: str = "") -> None:
        self.done += 1
        if self.handle is not None and (self.done == self.total or self.done % max(1, self.total // 50) == 0):
            from IPython.display import HTML

            self.handle.update(HTML(self._html(note)))
