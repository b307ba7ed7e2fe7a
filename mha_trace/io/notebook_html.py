"""A result as an HTML fragment for Jupyter: real tables with their shading, text as paragraphs.

The renderables are the ones the terminal prints, laid out without a width limit (nothing split,
nothing hidden), every sentence the terminal shows, spaces kept (a strip of positions stays aligned).
"""

import html
import re

from rich.console import Console, Group
from rich.style import Style
from rich.table import Table
from rich.text import Text

WIDE = 1000  # columns: every table whole, every column shown
_STYLE = "font-family:Menlo,'DejaVu Sans Mono',monospace;font-size:13px"


def to_html(renderables) -> str:
    console = Console(width=WIDE, color_system="truecolor", force_terminal=True,
                      force_jupyter=False, highlight=False, emoji=False, markup=False)
    parts = "".join(_part(console, r) for r in renderables)
    return f'<div class="mha-trace" style="{_STYLE}">{parts}</div>'


def _part(console: Console, r) -> str:
    if isinstance(r, Table):
        return _table(console, r)
    if isinstance(r, Text):
        return _text_block(console, r)
    if isinstance(r, Group) or hasattr(r, "renderables"):  # Group, Columns
        return "".join(_part(console, x) for x in r.renderables)
    if hasattr(r, "table") and hasattr(r, "title"):  # a weights matrix: one whole table
        return _title(r.title) + _table(console, r.table())
    if hasattr(r, "plain"):
        return _text_block(console, Text(r.plain))
    if isinstance(r, str):
        return _text_block(console, Text(r))
    with console.capture() as captured:  # anything else: as the terminal shows it
        console.print(r)
    return f"<pre>{html.escape(_ansi_free(captured.get()))}</pre>"


def _text_block(console: Console, text: Text) -> str:
    if any("\u2800" <= ch <= "\u28ff" for ch in text.plain):  # a braille grid: keep its lines
        return f'<pre style="line-height:1.1">{_spans(console, text)}</pre>'
    if "\n" in text.plain.strip("\n"):  # lines of prose: a paragraph each
        return "".join(_text_block(console, line) for line in text.split("\n"))
    if not text.plain.strip():
        return ""
    return f'<p style="white-space:pre-wrap">{_spans(console, text)}</p>'


def _title(title) -> str:
    plain = str(title.plain if isinstance(title, Text) else title)
    return f"<p><b>{html.escape(plain)}</b></p>" if plain.strip() else ""


def _table(console: Console, table: Table) -> str:
    head = "".join(f'<th style="text-align:{_align(c)};padding:2px 8px">'
                   f"{_spans(console, _as_text(c.header), c.header_style)}</th>"
                   for c in table.columns)
    rows = []
    for i in range(table.row_count):
        cells = []
        for c in table.columns:
            cell = _as_text(c._cells[i])
            style = _css(console, Style.combine([_style(console, c.style), _cell_style(cell)]))
            cells.append(f'<td style="text-align:{_align(c)};padding:2px 8px;{style}">'
                         f"{html.escape(cell.plain)}</td>")
        rows.append(f"<tr>{''.join(cells)}</tr>")
    caption = _title(table.caption) if table.caption else ""
    return (_title(table.title) if table.title else "") + (
        f'<table style="border-collapse:collapse"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>") + caption.replace("<b>", "").replace("</b>", "")


def _as_text(cell) -> Text:
    return cell if isinstance(cell, Text) else Text(str(cell))


def _align(column) -> str:
    return {"right": "right", "center": "center"}.get(column.justify, "left")


def _style(console: Console, style) -> Style:
    return console.get_style(style, default="") if isinstance(style, str) else (style or Style())


def _cell_style(cell: Text) -> Style:
    """A cell's own style: the text's, and a span's that covers the whole cell (the shading)."""
    styles = [cell.style] + [s.style for s in cell.spans if s.start == 0 and s.end >= len(cell)]
    return Style.combine([Style()] + [Style.parse(s) if isinstance(s, str) else s
                                      for s in styles if s])


def _css(console: Console, style: Style) -> str:
    return style.get_html_style() if style else ""


def _spans(console: Console, text: Text, extra=None) -> str:
    out = []
    for segment in text.render(console, end=""):
        style = segment.style or Style()
        if extra:
            style = _style(console, extra) + style
        css = _css(console, style)
        chunk = html.escape(segment.text)
        out.append(f'<span style="{css}">{chunk}</span>' if css else chunk)
    return "".join(out)


def _ansi_free(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
