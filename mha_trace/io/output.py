"""The one output layer every command goes through: rich, plain, JSON or markdown.

Rich tables on a terminal; no escape codes when piped, when NO_COLOR is set or with --no-color;
JSON and markdown for scripts and notes. Only the CLI calls `emit`.
"""

import contextlib
import copy
import io
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any

from rich import box
from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from mha_trace.errors import printable, printable_data
from mha_trace.io.streams import tool_stdout

SCHEMA_VERSION = 2  # 2: heads has one schema whatever the source (README: JSON)
PLAIN_WIDTH = 100  # width used when the output is not a terminal and COLUMNS is not set


class Format(str, Enum):
    table = "table"
    json = "json"
    markdown = "markdown"


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Output:
    format: Format = Format.table
    no_color: bool = False
    width: int | None = None
    svg: str | None = None  # also save what was printed as SVG / HTML (for slides)
    html: str | None = None
    title: str = "mha-trace"
    png: str | None = None  # per-head heatmaps (heads, explain, compare)
    theme: str = "dark"  # for --svg, --html and --png: "light" (slides) or "dark"
    step: bool = False  # --step: one table row or section per key press on a terminal
    scale: float | None = None  # --scale: the top of --png's colour scale (None: its largest)


@contextlib.contextmanager
def progress(total: int, what: str):
    """A bar on stderr for a slow loop, when stderr is a terminal; yields `advance(now=None)`
    (`now`: a new description, such as the loss so far). Piped, it prints nothing (scripts read
    stdout, and a bar in a log is noise)."""
    if total < 2 or not sys.stderr.isatty():
        yield lambda now=None: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), console=Console(file=sys.stderr), transient=True) as bar:
        task = bar.add_task(what, total=total)
        yield lambda now=None: bar.update(task, advance=1, **({"description": now} if now else {}))


def make_console(out: Output, file=None) -> Console:
    file = file or tool_stdout()
    width = out.width
    if width is None and not file.isatty() and "COLUMNS" not in os.environ:
        width = PLAIN_WIDTH
    no_color = out.no_color or bool(os.environ.get("NO_COLOR"))
    return Console(file=file, width=width, no_color=no_color, highlight=False,
                   color_system=None if no_color else "auto", emoji=False, markup=False)


def new_table(title: str | None = None, **kwargs) -> Table:
    """The house style: a rule under the header, no outer frame, readable without colour."""
    style: dict[str, Any] = dict(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1),
                                 collapse_padding=True, title_justify="left", title_style="bold",
                                 header_style="bold cyan", border_style="cyan")
    return Table(title=title, **(style | kwargs))


def printed_width(cell: str | Text) -> int:
    """The columns a table cell takes as the house console prints it (no markup, no emoji
    codes): its longest line, wide characters counted twice."""
    from rich.cells import cell_len

    return max(map(cell_len, str(cell).splitlines() or [""]))


def display_path(path: str) -> str:
    """mha_trace/core/attention.py for the package's own files, cwd-relative for files below cwd."""
    package_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path_abs = os.path.abspath(path)
    if path_abs.startswith(package_dir + os.sep):
        return "mha_trace/" + os.path.relpath(path_abs, package_dir).replace(os.sep, "/")
    cwd = os.getcwd()
    if path_abs.startswith(cwd + os.sep):
        return os.path.relpath(path_abs, cwd)
    return path


def _cell_text(cell) -> str:
    return cell.plain if isinstance(cell, Text) else str(cell)


def table_markdown(table: Table) -> str:
    """A rich Table as a GitHub-flavoured markdown table (title as a heading, caption after)."""
    columns = table.columns
    header = [" ".join(_cell_text(c.header).split()).replace("|", "\\|") for c in columns]
    rows = zip(*[[_cell_text(cell).replace("\n", " ").strip() for cell in c._cells] for c in columns])
    lines = [f"**{_cell_text(table.title)}**", ""] if table.title else []
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "|".join("---:" if c.justify == "right" else "---" for c in columns) + "|")
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    if table.caption:
        lines += ["", _cell_text(table.caption)]
    return "\n".join(lines)


def to_markdown(renderables) -> str:
    parts = []
    for r in renderables:
        if isinstance(r, Table):
            parts.append(table_markdown(r))
        elif isinstance(r, Group):
            parts.append(to_markdown(r.renderables))
        elif hasattr(r, "markdown"):
            parts.append(r.markdown())
        elif hasattr(r, "renderables"):  # rich Columns
            parts.append(to_markdown(r.renderables))
        else:
            parts.append(_cell_text(r).rstrip())
    return "\n\n".join(p for p in parts if p) + "\n"


def undefined_or(key: str, value: float | None, decimals: int, reason: str) -> dict:
    """A statistic for JSON: rounded, or, where it is undefined (None), null and beside it
    `<key>_undefined` saying why. JSON has no NaN: nothing undefined is ever a number."""
    if value is None:
        return {key: None, f"{key}_undefined": reason}
    return {key: round(value, decimals)}


def finite(a, places: int = 6):
    """Numbers (a nested array or one) for JSON, rounded; an undefined one (NaN) as null."""
    if hasattr(a, "tolist"):
        a = a.tolist()
    if isinstance(a, (list, tuple)):
        return [finite(x, places) for x in a]
    return round(float(a), places) if math.isfinite(a) else None


def to_json(data: dict) -> str:
    """--format json: the payload with its schema version, its strings made printable."""
    return _json(printable_data({"schema_version": SCHEMA_VERSION, **data}))


def _json(value, pad: str = "") -> str:
    """JSON indented by two spaces, except that a list holding no list or object (a row of
    weights, a shape, the tokens) is one line: a T × T matrix reads as T rows, and a model's
    millions of numbers go through the C encoder a row at a time."""
    inner = pad + "  "
    if isinstance(value, dict) and value:
        key = lambda k: json.dumps(k if isinstance(k, str) else json.dumps(k), ensure_ascii=False)
        return "{\n" + ",\n".join(f"{inner}{key(k)}: {_json(v, inner)}"
                                  for k, v in value.items()) + f"\n{pad}}}"
    if isinstance(value, (list, tuple)) and any(isinstance(v, (dict, list, tuple)) for v in value):
        return "[\n" + ",\n".join(inner + _json(v, inner) for v in value) + f"\n{pad}]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)  # strict: a NaN is a bug, never output


def emit(out: Output, renderables: Callable[[], list], data: Callable[[], dict],
         console: Console | None = None, page=None, slide=None, **options) -> None:
    """Print one command's result: `renderables()` for table/markdown, `data()` for JSON; only
    the one the format needs is made (a long sentence's tables are never built for JSON).

    The pictures first (`pictures`): --png draws `slide`, --html of a record with an interactive
    view (`page`: heads, a walk, a trace) is that view. With --svg / --html of any other record
    the same output is rendered once more into a recording console and saved.
    """
    console = console or make_console(out)
    out = pictures(out, page, slide, **options)
    if out.format in (Format.json, Format.markdown):
        if out.format == Format.json:
            text = to_json(data()) + "\n"
        else:
            text = "".join(printable(line) + "\n" for line in to_markdown(renderables()).splitlines())
        tool_stdout().write(text)
        if out.svg or out.html:  # a Text of a model's JSON costs seconds: only when asked
            _save_recordings(out, [Text(text.rstrip("\n"))], console.width)
        return
    shown = renderables()
    if console.is_terminal and out.step and sys.stdin and sys.stdin.isatty():
        _print_stepwise(console, shown)
    elif console.is_terminal:
        _print_all(console, shown)
    else:
        with console.capture() as captured:  # piped: plain lines without trailing padding
            _print_all(console, shown)
        console.file.write("".join(printable(line.rstrip()) + "\n"
                                   for line in captured.get().splitlines()))
    _save_recordings(out, shown, console.width)


def pictures(out: Output, page=None, slide=None, **options) -> Output:
    """--png (the record's registered slide) and --html (its interactive page, when it has one);
    what is left to write: `out` without what was written here."""
    from mha_trace.io.files import write_atomic
    from mha_trace.io.page import page as interactive, slide as draw

    if out.png:
        if slide is None:
            from mha_trace.errors import MhaError

            raise MhaError("this view has no slide (--html or --svg save it as it shows)", quantity="png")
        draw(slide, out.png, out.theme, scale=out.scale, **options)
        out = replace(out, png=None)
    if page is not None and out.html:
        write_atomic(out.html, interactive(page), "html")
        out = replace(out, html=None)
    return out


def shown_elsewhere(out: Output) -> str | None:
    """What shows a view too long for the terminal: "the picture shows" (--png), "the page
    shows" (--html), or None."""
    return "the picture shows" if out.png else "the page shows" if out.html else None


def _save_recordings(out: Output, renderables: list, width: int) -> None:
    if not (out.svg or out.html):
        return
    from mha_trace.io.files import write_atomic

    recorder = Console(record=True, file=io.StringIO(), width=width, color_system="truecolor",
                       force_terminal=True, highlight=False, emoji=False, markup=False)
    _print_all(recorder, renderables)
    from rich.terminal_theme import DEFAULT_TERMINAL_THEME, SVG_EXPORT_THEME

    theme = DEFAULT_TERMINAL_THEME if out.theme == "light" else SVG_EXPORT_THEME
    if out.svg:
        write_atomic(out.svg, recorder.export_svg(title=out.title, clear=False, theme=theme), "svg")
    if out.html:
        write_atomic(out.html, recorder.export_html(clear=False, theme=theme), "html")


def titled_parts(r) -> list:
    """A table's title and caption as full-width lines, not wrapped to the table's own width."""
    if not (isinstance(r, Table) and (r.title or r.caption)):
        return [r]
    title, caption = r.title, r.caption
    bare = copy.copy(r)
    bare.title = bare.caption = None
    return ([Text(str(title), style="bold blue")] if title else []) + [bare] + (
        [Text(str(caption))] if caption else [])


def _pieces(console: Console, part) -> list[tuple[str, str | None]]:
    """What one renderable prints, in the pieces --step reveals, each with the table header it
    sits under (None for anything but a table row): a table row by row (its header first; a
    row's wrapped lines stay together), anything else whole."""
    with console.capture() as captured:
        console.print(part)
    lines = captured.get().splitlines(keepends=True)
    if not isinstance(part, Table):
        return [("".join(lines), None)]
    plain = [_ANSI.sub("", line) for line in lines]
    rule = next((i for i, p in enumerate(plain) if p.strip() and set(p.strip()) <= set("─━═")),
                None)
    if rule is None:
        return [("".join(lines), None)]
    header = "".join(lines[:rule + 1])
    rows: list[str] = []
    for line, p in zip(lines[rule + 1:], plain[rule + 1:]):
        if p[:4].strip() or not rows:  # a new row starts in the first column
            rows.append(line)
        else:
            rows[-1] += line
    return [(header, None)] + [(row, header) for row in rows]


def _print_stepwise(console: Console, renderables: list) -> None:
    """--step: print a piece, wait for a key (q shows the rest at once), print the next. When
    a table's header has scrolled off the screen, it is printed again above the next row."""
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    prompt = "  (--step: any key for more, q for the rest)"
    pieces = []
    for i, r in enumerate(renderables):
        for j, part in enumerate(titled_parts(r)):
            found = _pieces(console, part)
            if i and not j:
                found[0] = ("\n" + found[0][0], found[0][1])
            pieces += found
    below = 0  # lines printed since the current header
    try:
        tty.setcbreak(fd)
        for k, (piece, header) in enumerate(pieces):
            if header and below + piece.count("\n") > console.height - 2:
                console.file.write(header)
                below = 0
            console.file.write(piece)
            below = below + piece.count("\n") if header else 0
            if k == len(pieces) - 1:
                break
            console.file.write(prompt if console.no_color else f"\x1b[2m{prompt}\x1b[0m")
            console.file.flush()
            key = os.read(fd, 1)
            console.file.write("\r\x1b[2K")
            if key in (b"q", b"Q"):
                console.file.write("".join(p for p, _ in pieces[k + 1:]))
                break
            if key == b"\x03":
                raise KeyboardInterrupt
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
        console.file.flush()


def _print_all(console: Console, renderables: list) -> None:
    for i, r in enumerate(renderables):
        if i:
            console.print()
        for part in titled_parts(r):
            console.print(part)
