"""`shapes --compact`, the layout for slides: the L04 lecture's table of eight rows, each shape in
numbers and in symbols."""

from rich.text import Text

from mha_trace.core.costs import human_bytes
from mha_trace.io.output import new_table
from mha_trace.io.units import shape_text
from mha_trace.render.steps import elide, title
from mha_trace.analyses.shapes import ShapesReport

COMPACT_ROWS = ("input", "W_q", "view", "transpose", "attention", "transpose back",
                "contiguous + view", "W_o")


def compact_rows(report: ShapesReport) -> list[tuple[str, int]]:
    """(row name, step index) for the eight rows, found in the traced steps."""
    steps = report.steps
    first = lambda op, after=0: next(i for i, st in enumerate(steps) if i >= after and st.op == op)
    q = first("linear")
    context = max(i for i, st in enumerate(steps) if st.op in ("matmul", "scaled_dot_product_attention"))
    back = first("transpose", context)
    merged = first("view", back)
    return list(zip(COMPACT_ROWS, (0, q, first("view", q), first("transpose", q), context, back,
                                   merged, len(steps) - 1)))


def compact_table(report: ShapesReport, sym: list[str], width: int = 100):
    """The L04 table for slides: eight rows, each shape in numbers and in symbols (`sym`, from
    shapes.shape_symbols), and the code on one line in the width left (below 90 columns without
    the code)."""
    rows = compact_rows(report)
    texts = {}
    for name, i in rows:
        s = report.steps[i]
        code = "softmax(QKᵀ/√d_k)·V" if name == "attention" and s.op == "matmul" else s.text
        if name == "contiguous + view" and report.steps[i - 1].op == "contiguous":
            code = ".contiguous()" + code
        texts[name] = code
    others = [[n for n, _ in rows], [shape_text(report.steps[i].shape) for _, i in rows],
              [sym[i] for _, i in rows], ["alloc", *(human_bytes(report.steps[i].bytes) for _, i in rows)]]
    room = width - sum(max(len(c) for c in col) for col in others) - 2 * len(others)
    table = new_table(title(report))
    table.add_column("step", style="bold", no_wrap=True)
    with_code = width >= 90
    if with_code:
        code_width = min(room, max(len(t) for t in texts.values()))
        table.add_column("code", no_wrap=True, width=code_width)
    table.add_column("shape", no_wrap=True)
    table.add_column("in symbols", no_wrap=True)
    table.add_column("alloc", justify="right", no_wrap=True)
    for name, i in rows:
        s = report.steps[i]
        copied = report.steps[i - 1] if name == "contiguous + view" else s  # the copy, if any
        alloc = Text("view", style="green") if copied.is_view else Text(
            human_bytes(copied.bytes), style="yellow")
        code = [Text(elide(texts[name], code_width))] if with_code else []
        table.add_row(name, *code, shape_text(s.shape), sym[i], alloc)
    table.caption = "The eight steps of the lecture's table; --compact off shows every op."
    table.caption_justify = "left"
    return table
