"""What the explorer's panes show, built from its session: rich renderables, no widgets.

The Textual app (`explorer.py`) puts these into its panes; each function here is plain (the
session's records in, text out), so every pane shows the CLI's numbers.
"""

from mha_trace.core.head import Head
import linecache
import textwrap

from rich.console import Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

MAX_MAPS = 48  # the split pane draws this many heads' maps at most (d_model 512 splits into 512)


def dims(h: int, d_k: int) -> str:
    """Head h's (0-based) columns of Q, K, V and of the concatenation."""
    return f"dim {h}" if d_k == 1 else f"dims {h * d_k}–{(h + 1) * d_k - 1}"


def step(session, s, light: bool) -> tuple:
    """(the source around the step's line, what the step did) for the trace pane."""
    from mha_trace.render.shapes import shape_text, step_note, stride_text

    if s.line:
        first = max(1, s.line - 2)
        lines = [linecache.getline(s.file, n).rstrip("\n") for n in range(first, s.line + 3)]
        source = Syntax(textwrap.dedent("\n".join(lines)), "python", line_numbers=True,
                        start_line=first, highlight_lines={s.line}, word_wrap=False,
                        theme="default" if light else "monokai", background_color="default")
    else:
        source = Text(f"(input: {session.report().run.call})", style="dim")
    kind = "view (shares memory)" if s.is_view else "new tensor"
    return source, Group(
        Text(f"shape {shape_text(s.shape)}   stride {stride_text(s.stride)}   contiguous "
             f"{'yes' if s.contiguous else 'no'}   {kind}", style="bold"),
        Text(step_note(s)))


def heads_title(s, view) -> Text:
    """The heads pane's title: which head, its dims, its K/V head."""
    h = s.head - 1
    name = Head(s.layer, s.head).name if s.model else str(s.head)  # a model's head is L.H
    kv = f", K/V head {view.kv_head_of(h) + 1}" if view.kv_heads != view.heads else ""
    return Text.assemble(
        (f"Head {name} of {view.heads} ", "bold"),
        f"({dims(h, view.d_k)}, d_k = {view.d_k}{kv}). Rows are queries, columns keys; "
        "* marks each row's largest weight.")


def matrix(view, h: int, width: int) -> tuple[list, list, int]:
    """The heads pane's (column labels, rows, gap) for head h (from 0): the first of the command
    line's layouts (its decimals, then fewer, then shortened key labels, then no leading zeros)
    that fits `width` columns with a space each side of a cell (gap 1), then with one space
    between cells (gap 0); the tightest when none does (the table then scrolls)."""
    from rich.cells import cell_len

    from mha_trace.render.matrices import weight_cells, weights_table

    tokens = list(view.tokens)
    fitter = weights_table("", tokens, view.weights[h], view.mask, 4 if len(tokens) <= 8 else 2)
    for gap in (1, 0):
        for layout in fitter.layouts():
            labels = ["q \\ k", *fitter.labels(layout)]
            rows = [(Text(tokens[i], style="bold"), *cells) for i, cells in enumerate(
                weight_cells(view.weights[h], view.mask, layout.decimals, layout.lead))]
            need = sum(max(cell_len(str(label)), *(cell_len(row[j].plain) for row in rows))
                       + (2 if gap else 1) for j, label in enumerate(labels))
            if need <= width:
                return labels, rows, gap
    return labels, rows, 0


def cell(s, i: int, j: int) -> str | None:
    """What query i gives key j in the current head (None off the table)."""
    view = s.view()
    if not (0 <= i < len(view.tokens) and 0 <= j < len(view.tokens)):
        return None
    w = view.weights[s.head - 1]
    masked = view.mask is not None and not view.mask[i][j]
    value = "masked (weight exactly 0)" if masked else f"{w[i, j]:.6f}"
    rank = int((w[i] > w[i, j]).sum()) + 1
    return (f"'{view.tokens[i]}' looks at '{view.tokens[j]}': {value}"
            + ("" if masked else f", rank {rank} of {len(view.tokens)} in its row")
            + f"   (enter: walk '{view.tokens[i]}' in the token pane)")


def walk_pane(s) -> Group:
    """The picked token through the current head, as `explain` shows it."""
    from mha_trace.io.output import titled_parts

    shown = s.walk().renderables(decimals=4, head=s.head)
    return Group(*(part for r in shown for part in titled_parts(r)))  # titles and sums full width


def split(s, width: int) -> Group:
    """Every head of the current split side by side, as many to a row as `width` holds."""
    view = s.view()
    counts = "  ".join(f"[{c}]" if c == s.heads else str(c) for c in s.head_counts())
    small = len(view.tokens) <= 8
    maps = [_head_map(s, view, h, small) for h in range(min(view.heads, MAX_MAPS))]
    widest = max(len(t.plain) for m in maps for t in m.renderables)
    per_row = max(1, (width - 2) // (widest + 2))
    grid = Table.grid(padding=(0, 2))
    for row in range(0, len(maps), per_row):
        grid.add_row(*maps[row:row + per_row])
    rows = ", ".join(map(str, view.distinct_rows))
    return Group(
        Text.assemble(("Head counts: ", "bold"), counts + "   ",
                      "(a trained model's split is fixed)" if s.model
                      else "(+ / - re-split the same Q, K, V)"),
        Text(f"H = {view.heads}, d_k = {view.d_k}: each head scores with {view.d_k}-term dot "
             f"products; distinct weight rows per head: {rows} of {len(view.tokens)}."),
        Text(f"Rows are queries, columns keys, in token order: {' '.join(view.tokens)}."
             + ("" if small else " A dot: a key with at least half its query's largest "
                                 "weight."),
             style="dim"),
        grid,
        *([Text(f"Heads {MAX_MAPS + 1}-{view.heads} are not drawn here (the heads pane shows "
                "any of them: [ ] pick).", style="dim")] if view.heads > MAX_MAPS else []))


def _head_map(s, view, h: int, small: bool) -> Group:
    """One head of the split: every weight shaded (a few tokens) or a braille map (many)."""
    from mha_trace.render.matrices import weight_cells
    from mha_trace.render.model import braille_map

    title = Text(f"head {h + 1}{' ◂' if h + 1 == s.head else ''}: {dims(h, view.d_k)}",
                 style="bold")
    if small:  # every weight, shaded as in the heads pane
        lines = [Text(" ").join(row) for row in weight_cells(view.weights[h], view.mask, 2)]
    else:
        lines = braille_map(view.weights[h])
    return Group(title, *lines)


def ablation(s) -> Group:
    """Which heads are off, and how far each token's output moved."""

    marks = "  ".join(f"{h}:{'off' if h in s.off else 'on'}" for h in range(1, s.heads + 1))
    head = Text.assemble(("Heads ", "bold"), marks + "   ",
                         f"(space: head {s.head} off or on; [ ] pick; a: all on)")
    result = s.ablation()
    if result is None:
        body = [Text("Every head is on: switch one off to see how far each token's output "
                     "moves.", style="dim")]
    else:
        body = result.renderables(decimals=4)
    return Group(head, Text(""), *body)
