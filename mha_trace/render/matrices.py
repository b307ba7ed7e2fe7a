"""What every weights view shares: numbers, vectors, shading, weight matrices and config facts."""

from dataclasses import dataclass

import numpy as np
from rich.style import Style
from rich.table import Table
from rich.text import Text

from mha_trace.io.output import new_table, printed_width

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
    """Cell background for a value scaled to 0..1 (dark to bright), black or white text by WCAG's
    contrast ratio (black wins over L = 0.179: viridis's mid-greens up); stripped when plain."""
    lin = [c / 255 / 12.92 if c <= 10 else ((c / 255 + 0.055) / 1.055) ** 2.4 for c in ramp(x)]
    light = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2] > 0.179
    return Style(bgcolor="rgb({},{},{})".format(*ramp(x)), color="rgb(0,0,0)" if light else "rgb(255,255,255)")


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


def weight_cells(weights, mask, decimals: int, lead: bool = True) -> list[list[Text]]:
    """A weight matrix as shaded cells: scaled over its unmasked weights, TOP on each row's
    largest, MASKED where a key is masked. Tables and the explorer show these same cells.
    Without `lead`, weights (never above 1) drop their leading zero: .2218."""
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
                text = fmt(w, decimals)
                text = text[1:] if not lead and text.startswith("0.") else text
                cells.append(Text(text + (TOP if j in tops else " "),
                                  style=shade(x) + Style(bold=j in tops), justify="right"))
        rows.append(cells)
    return rows


class _Legend:
    """The legend; the sentence on shading only where there is colour."""

    def __init__(self, sums: str = "each row sums to 1"):
        self.sums = sums

    def __rich_console__(self, console, options):
        colour = "" if console.no_color or console.color_system is None else (
            "Shading is scaled per matrix, from its smallest weight (dark) to its largest "
            "(bright). ")
        yield Text(f"Rows are queries, columns keys; {self.sums}. {colour}{TOP} marks each "
                   f"row's largest weight (every one on a tie; none in a row of equal weights). "
                   f"{MASKED} marks a masked key (weight exactly 0).")

    @property
    def plain(self) -> str:
        return (f"Rows are queries, columns keys; {self.sums}. {TOP} marks each row's "
                f"largest weight (every one on a tie; none in a row of equal weights). {MASKED} "
                f"marks a masked key (weight exactly 0).")

    def markdown(self) -> str:
        return self.plain


def legend(view=None) -> _Legend:
    """The weights tables' legend, with what the view's rows sum to: 1, or less (a sink took a
    share; differential attention took the second map away λ times)."""
    if getattr(view, "sink", None) is not None:
        return _Legend("each row sums to 1 less its sink's share (the attention paid to nothing)")
    if getattr(view, "lam", None) is not None:
        return _Legend(f"each row sums to 1 - λ = {1 - view.lam[0]:.4f} (the second map taken away λ = "
                       f"{view.lam[0]:.4f} times; a weight may be negative)")
    return _Legend()


@dataclass(frozen=True)
class Layout:
    """How a weight matrix is drawn: its decimals, its key labels cut to `keys` characters (0:
    whole), and whether weights keep their leading zero."""

    decimals: int
    keys: int = 0
    lead: bool = True

    def label(self, token: str) -> str:
        return token if not self.keys or len(token) <= self.keys else token[:self.keys - 1] + "…"


class _WeightsTable:
    """A weight matrix that fits the width it is given. It tries, in turn: its decimals; 3, then
    2; 2 with long key labels shortened (a line below names them); 2 without leading zeros. Only
    when none fits does it split its key columns into several tables, numbers never cut."""

    def __init__(self, title: str, tokens, weights, mask, decimals: int, rows=None,
                 corner: str = "q \\ k"):
        self.title, self.tokens, self.weights = title, list(tokens), weights
        self.mask, self.decimals = mask, decimals
        self.rows, self.corner = list(tokens if rows is None else rows), corner  # the row labels
        self.fit = None  # the columns it may take when it shares a row (set by SideBySide)
        self._widths = {}  # Layout -> printed width
        self._cells = {}  # (decimals, lead) -> the shaded cells

    def _room(self, max_width: int) -> int:
        """The width to fit: the console's, or less when several go side by side."""
        return min(max_width, self.fit or max_width)

    def chosen(self, max_width: int) -> Layout | None:
        """The first layout that fits, or None (then the keys are split). Beside others
        (`fit`), the tightest layout rather than a split: the row then holds fewer."""
        fits = lambda layout, room: self.width(layout) <= room
        room = self._room(max_width)
        found = next((layout for layout in self.layouts() if fits(layout, room)), None)
        if found is None and self.fit and fits(self.layouts()[-1], max_width):
            return self.layouts()[-1]
        return found

    def width(self, layout: Layout | None = None) -> int:
        """How wide the table prints in this layout, counted as the house style lays a table out
        (measuring a rich Table of every cell took half of a model's heads view): each column
        its widest cell, a padding column after each but the last (none without leading
        zeros), a divider between columns."""
        layout = layout or Layout(self.decimals)
        if layout not in self._widths:
            columns = [[self.corner, *self.rows], *([label, *(row[j] for row in self._shaded(layout))]
                                                    for j, label in enumerate(self.labels(layout)))]
            widest = [max(map(printed_width, column)) for column in columns]
            self._widths[layout] = sum(widest) + (2 if layout.lead else 1) * (len(widest) - 1)
        return self._widths[layout]

    def _shaded(self, layout: Layout) -> list[list[Text]]:
        key = (layout.decimals, layout.lead)
        if key not in self._cells:
            self._cells[key] = weight_cells(self.weights, self.mask, layout.decimals, layout.lead)
        return self._cells[key]

    def labels(self, layout: Layout) -> list[str]:
        """The key labels in this layout: shortened, except where two would read the same (the·1
        and the·7 both "the…"), which keep their whole label."""
        short = [layout.label(t) for t in self.tokens]
        return [t if a != t and short.count(a) > 1 else a for a, t in zip(short, self.tokens)]

    def layouts(self) -> list[Layout]:
        d = self.decimals
        fewer = [Layout(k) for k in (3, 2) if k < d]
        short = min(d, 2)
        return [Layout(d), *fewer, Layout(short, short + 3), Layout(short, short + 2, False)]

    def table(self, keys=None, layout: Layout | None = None) -> Table:
        layout = layout or Layout(self.decimals)
        keys = range(len(self.tokens)) if keys is None else keys
        table = new_table(padding=(0, 1) if layout.lead else 0)  # tight: the divider alone
        table.add_column(self.corner, style="bold", no_wrap=True)
        labels = self.labels(layout)
        for j in keys:
            table.add_column(labels[j], justify="right", no_wrap=True)
        for i, row in enumerate(self._shaded(layout)):
            table.add_row(self.rows[i], *(row[j] for j in keys))
        return table

    def _chunks(self, width: int) -> list[range]:
        label = max(len(self.corner), *(len(t) for t in self.rows))
        widths = [max(self.decimals + 3, len(t)) for t in self.tokens]  # 0.1234 and the marker
        room, chunks, start, used = width - label, [], 0, 0
        for j, w in enumerate(widths):
            if j > start and used + w + 2 > room:
                chunks.append(range(start, j))
                start, used = j, 0
            used += w + 2
        chunks.append(range(start, len(self.tokens)))
        return chunks

    def _notes(self, layout: Layout, full: int) -> list[Text]:
        notes = []
        if layout.decimals != self.decimals:
            notes.append(f"{layout.decimals} decimals to fit side by side" if self.fit else
                         f"{layout.decimals} decimals to fit (--width {full} shows {self.decimals})")
        cut = {a: t for a, t in zip(self.labels(layout), self.tokens) if a != t}
        if cut:
            notes.append("keys shortened: " + ", ".join(f"{a} {t}" for a, t in cut.items()))
        return [Text(n, style="dim") for n in notes]

    def __rich_console__(self, console, options):
        yield Text(self.title, style="bold blue")
        full, room = self.width(), self._room(options.max_width)
        layout = self.chosen(options.max_width)
        if layout is not None:
            yield self.table(layout=layout)
            yield from self._notes(layout, full)
            return
        chunks = self._chunks(room)
        for keys in chunks:
            yield Text(f"keys {keys.start + 1}–{keys.stop} of {len(self.tokens)} (--width {full} "
                       f"shows them in one table)", style="dim")
            yield self.table(keys)

    def __rich_measure__(self, console, options):
        from rich.measure import Measurement

        layout = self.chosen(options.max_width)
        width = self.width(layout) if layout else self._room(options.max_width)
        width = min(max(width, len(self.title)), options.max_width)  # the title on one line
        return Measurement(width, width)

    def markdown(self) -> str:
        from mha_trace.io.output import table_markdown

        table = self.table()
        table.title = self.title
        return table_markdown(table)


def weights_table(title: str, tokens, weights, mask, decimals: int, rows=None,
                  corner: str = "q \\ k") -> _WeightsTable:
    """A weight matrix that fits the console's width (or its share of a row: SideBySide); its
    rows are the queries unless `rows` names them (`corner` heads their column)."""
    return _WeightsTable(title, tokens, weights, mask, decimals, rows, corner)


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
        part = "" if c.rope_dim is None else f" on {c.rope_dim} of {c.d_k} dims"
        parts.append(f"RoPE base {c.rope_base:g}{part}")
    if c.window is not None:
        parts.append(f"window {c.window}")
    parts += c.scoring.named()
    if c.latent is not None:
        parts.append(f"MLA d_c {c.latent}, d_R {view.latent.rope}" + (", absorbed" if c.absorbed else ""))
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
            "rope": c.rope, "rope_base": c.rope_base, "window": c.window, **c.scoring.module_options()}
    if c.rope and c.rope_dim is not None:  # partial RoPE: the dims that turn
        data["rope_dim"] = c.rope_dim
    if c.latent is not None:  # MLA: its sizes as DeepSeek's configs name them
        data["latent"] = {"kv_lora_rank": c.latent, "qk_rope_head_dim": view.latent.rope, "absorbed": c.absorbed}
    return {**data, "origin": c.origin} if c.origin else data


def heads_json(source: dict, settings: dict, tokens, mask, heads: list, average, output,
               decimals: int) -> dict:
    """`heads --format json`, schema 2: the same keys whatever the run's source; what only one
    source has sits under "source" (its "kind": config, module or model)."""
    matrix = lambda m: None if m is None else rounded(m, decimals)
    return {"command": "heads", "source": source, "settings": settings, "tokens": list(tokens),
            "decimals": decimals, "mask": None if mask is None else mask.tolist(),
            "heads": heads, "average": matrix(average), "output": matrix(output)}


def head_entry(layer: int, head: int, kv_head: int | None, weights, decimals: int,
               effect=None) -> dict:
    """One head's weights (queries × keys), layer and head counted from 1; with --effect, its
    effect weights beside them."""
    entry = {"layer": layer, "head": head, "kv_head": kv_head, "weights": rounded(weights, decimals)}
    return entry if effect is None else {**entry, "effect": rounded(effect, decimals)}


EFFECT_NOTE = ("Effect: each weight times the length of what that key's value moves through the "
               "head's block of W_O (‖v_j·W_O‖, bias included), renormalised per query: where "
               "the head's output really comes from (Kobayashi et al. 2020, \"Attention is not "
               "only a weight\").")


def with_effect_tables(view, tables: list, picked: list, decimals: int, layer: int = 0) -> list:
    """Each head's weights table followed by its effect table (heads from 0), when the view has
    effect weights; the tables alone otherwise."""
    if view.effect is None:
        return tables
    out = []
    for table, h in zip(tables, picked):
        out += [table, weights_table(f"{table.title.split(':')[0]}: effect", view.tokens,
                                     view.effect[layer][h], view.mask, decimals)]
    return out
