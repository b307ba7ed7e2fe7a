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
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":")).replace("<", "\\u003c")
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
