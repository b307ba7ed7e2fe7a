"""What every weights view shares: numbers, vectors, shading, weight matrices and config facts."""

import numpy as np
from rich.style import Style
from rich.table import Table
from rich.text import Text

from mha_trace.output import new_table

MASKED = "·"
MAX_DIMS = 6  # matrices wider than this show their first dims; JSON has them all


def fmt(x: float, decimals: int) -> str:
    s = f"{x:.{decimals}f}"
    return s[1:] if s.startswith("-") and float(s) == 0 else s  # no "-0.0000"


def short(x: float) -> str:
    """Inputs as the chapter writes them: 1.0, 0.5, and 4 decimals only where needed."""
    return f"{x:.1f}" if abs(x * 10 - round(x * 10)) < 1e-12 else f"{x:.4f}"


def vector(values, decimals: int, limit: int = 16) -> str:
    """[a, b, c]; past `limit` numbers, the first 8 and a count (JSON has them all)."""
    if len(values) > limit:
        shown = ", ".join(fmt(x, decimals) for x in values[:8])
        return f"[{shown}, … {len(values) - 8} more]"
    return "[" + ", ".join(fmt(x, decimals) for x in values) + "]"


# viridis, five stops: dark purple to yellow. Every stop differs from both a black and a white
# terminal background, and its lightness rises steadily, so order survives a washed-out projector.
_RAMP = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
TOP = "*"  # marks each row's largest weight: the information needs no colour


def ramp(x: float) -> tuple[int, int, int]:
    x = max(0.0, min(1.0, x)) * (len(_RAMP) - 1)
    i = min(int(x), len(_RAMP) - 2)
    t = x - i
    return tuple(int(a + (b - a) * t) for a, b in zip(_RAMP[i], _RAMP[i + 1]))


def shade(x: float) -> Style:
    """Cell background for a value scaled to 0..1 (dark to bright); stripped when plain."""
    r, g, b = ramp(x)
    light = 0.299 * r + 0.587 * g + 0.114 * b > 140
    return Style(bgcolor=f"rgb({r},{g},{b})", color="black" if light else "white")


def scale(values) -> tuple[float, float]:
    """(lowest, highest) of the unmasked values: shading runs over this range, per matrix."""
    values = np.asarray(values, float)
    return (float(values.min()), float(values.max())) if values.size else (0.0, 1.0)


def top_keys(row, allowed=None) -> set:
    """Indices of a row's largest weight; all of them on a tie, none when the whole row is equal."""
    idx = [j for j in range(len(row)) if allowed is None or allowed[j]]
    if not idx:
        return set()
    best = max(row[j] for j in idx)
    tops = {j for j in idx if abs(row[j] - best) <= 1e-12}
    return set() if len(tops) == len(idx) and len(idx) > 1 else tops


def weight_cells(weights, mask, decimals: int) -> list[list[Text]]:
    """A weight matrix as shaded cells: scaled over its unmasked weights, TOP on each row's
    largest, MASKED where a key is masked. Tables and the explorer show these same cells."""
    keep = np.ones(np.shape(weights), bool) if mask is None else np.asarray(mask, bool)
    lo, hi = scale(np.asarray(weights)[keep])
    rows = []
    for i, row in enumerate(weights):
        tops = top_keys(row, None if mask is None else mask[i])
        cells = []
        for j, w in enumerate(row):
            if not keep[i][j]:
                cells.append(Text(MASKED + " ", justify="right"))
            else:
                x = (w - lo) / (hi - lo) if hi > lo else 0.5
                cells.append(Text(fmt(w, decimals) + (TOP if j in tops else " "),
                                  style=shade(x) + Style(bold=j in tops), justify="right"))
        rows.append(cells)
    return rows


class _Legend:
    """The legend; the sentence on shading only where there is colour."""

    def __rich_console__(self, console, options):
        colour = "" if console.no_color or console.color_system is None else (
            "Shading is scaled per matrix, from its smallest weight (dark) to its largest "
            "(bright). ")
        yield Text(f"Rows are queries, columns keys; each row sums to 1. {colour}{TOP} marks each "
                   f"row's largest weight (every one on a tie; none in a row of equal weights). "
                   f"{MASKED} marks a masked key (weight exactly 0).")

    @property
    def plain(self) -> str:
        return (f"Rows are queries, columns keys; each row sums to 1. {TOP} marks each row's "
                f"largest weight (every one on a tie; none in a row of equal weights). {MASKED} "
                f"marks a masked key (weight exactly 0).")

    def markdown(self) -> str:
        return self.plain


def legend() -> _Legend:
    return _Legend()


class _WeightsTable:
    """A weight matrix that splits its key columns into several tables when it cannot fit.

    Numbers are never cut: at 80 columns an 11-token sentence prints as two tables of keys.
    """

    def __init__(self, title: str, tokens, weights, mask, decimals: int):
        self.title, self.tokens, self.weights = title, list(tokens), weights
        self.mask, self.decimals = mask, decimals

    def _widths(self) -> list[int]:
        return [max(self.decimals + 3, len(t)) for t in self.tokens]  # 0.1234 and the marker

    def _label_width(self) -> int:
        return max(len("q \\ k"), *(len(t) for t in self.tokens))

    def table(self, keys=None) -> Table:
        keys = range(len(self.tokens)) if keys is None else keys
        table = new_table()
        table.add_column("q \\ k", style="bold", no_wrap=True)
        for j in keys:
            table.add_column(self.tokens[j], justify="right", no_wrap=True)
        cells = weight_cells(self.weights, self.mask, self.decimals)
        for i, row in enumerate(cells):
            table.add_row(self.tokens[i], *(row[j] for j in keys))
        return table

    def _chunks(self, width: int) -> list[range]:
        room, chunks, start, used = width - self._label_width(), [], 0, 0
        for j, w in enumerate(self._widths()):
            if j > start and used + w + 2 > room:
                chunks.append(range(start, j))
                start, used = j, 0
            used += w + 2
        chunks.append(range(start, len(self.tokens)))
        return chunks

    def __rich_console__(self, console, options):
        yield Text(self.title, style="bold blue")
        chunks = self._chunks(options.max_width)
        for keys in chunks:
            if len(chunks) > 1:
                yield Text(f"keys {keys.start + 1}–{keys.stop} of {len(self.tokens)} "
                           f"(--width {self._label_width() + sum(self._widths()) + 2 * len(self.tokens)} "
                           f"shows them in one table)", style="dim")
            yield self.table(keys)

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        full = self._label_width() + sum(self._widths()) + 2 * len(self.tokens)
        return Measurement(min(full, options.max_width), full)

    def markdown(self) -> str:
        from mha_trace.output import table_markdown

        table = self.table()
        table.title = self.title
        return table_markdown(table)


def weights_table(title: str, tokens, weights, mask, decimals: int) -> _WeightsTable:
    return _WeightsTable(title, tokens, weights, mask, decimals)


def matrix_table(title: str, tokens, matrix, decimals: int, first: int = 0) -> Table:
    width = matrix.shape[1]
    shown = min(width, MAX_DIMS)
    table = new_table(title)
    table.add_column("token", style="bold")
    for d in range(shown):
        table.add_column(f"d{first + d}", justify="right", no_wrap=True)
    if shown < width:
        table.add_column(f"… {width - shown} more", justify="left")
    for t, row in zip(tokens, matrix):
        extra = ["…"] if shown < width else []
        table.add_row(t, *(fmt(x, decimals) for x in row[:shown]), *extra)
    return table


def head_title(view, h: int) -> str:
    d_k, start = view.d_k, h * view.d_k
    kv = f", K/V head {view.kv_head_of(h) + 1}" if view.kv_heads != view.heads else ""
    return (f"Head {h + 1} of {view.heads}: dims {start}–{start + d_k - 1}, d_k = {d_k}{kv}")


def sharing_table(view) -> Table:
    table = new_table(f"Grouped-query attention: {view.heads} query heads share "
                      f"{view.kv_heads} K/V heads")
    table.add_column("K/V head", justify="right")
    table.add_column("query heads")
    for g in range(view.kv_heads):
        members = [str(h + 1) for h in range(view.heads) if view.kv_head_of(h) == g]
        table.add_row(str(g + 1), ", ".join(members))
    return table


def describe(view) -> str:
    c = view.config
    form = c.origin or ("explicit Q, K, V" if c.explicit else f"generated, seed {c.seed}")
    parts = [f"{len(c.tokens)} tokens", f"d_model {c.d_model}",
             f"{c.heads} head" + ("s" if c.heads > 1 else ""),
             f"d_k {c.d_k}", form]
    if view.kv_heads != view.heads:
        parts.insert(3, f"{view.kv_heads} K/V heads")
    if c.mask != "none":
        parts.append(f"mask {c.mask}")
    if c.rope:
        parts.append(f"RoPE base {c.rope_base:g}")
    if c.window is not None:
        parts.append(f"window {c.window}")
    if c.pad:
        parts.append(f"pad {c.pad}")
    return ", ".join(parts)


def rounded(matrix, decimals: int):
    """A matrix for JSON at full precision: --decimals is for reading, scripts get every digit."""
    return [[float(x) for x in row] for row in matrix]


def config_data(view) -> dict:
    c = view.config
    data = {"name": c.name, "title": c.title, "tokens": list(c.tokens), "d_model": c.d_model,
            "heads": c.heads, "kv_heads": view.kv_heads, "d_k": c.d_k, "mask": c.mask,
            "pad": c.pad, "explicit": c.explicit, "seed": None if c.explicit or c.origin else c.seed,
            "rope": c.rope, "rope_base": c.rope_base, "window": c.window}
    return {**data, "origin": c.origin} if c.origin else data
