"""Render a class's gradebook (`verify --module 'class/*.py:Name'`): a row per submission, then
the class's mistakes counted and what held each submission's process."""

from rich.text import Text

from mha_trace.analyses.gradebook import VERDICTS, Gradebook
from mha_trace.io.gradebook import happened
from mha_trace.io.output import new_table
from mha_trace.records import data, renderables

STYLES = {"right": "green", "wrong": "bold red", "variant": "yellow", "refused": "magenta", "stopped": "bold magenta"}


def gradebook_renderables(g: Gradebook, width: int) -> list:
    n = len(g.rows)
    course = f", under the {g.course} profile" if g.course else ""
    table = new_table(f"verify: {n} submission{'s' * (n != 1)} of {g.class_name} against the lecture's module{course}")
    table.add_column("student", overflow="fold", max_width=max(12, width // 4))
    table.add_column("verdict", no_wrap=True)
    table.add_column("line", justify="right", no_wrap=True)
    table.add_column("mistake, or why not checked", ratio=1, overflow="fold")
    for r in g.rows:
        table.add_row(r["student"], Text(VERDICTS[r["verdict"]], style=STYLES[r["verdict"]]),
                      "—" if r["line"] is None else str(r["line"]), "; ".join(happened(r)))
    return [table, Text("\n".join(summary_lines(g)))]


def summary_lines(g: Gradebook) -> list:
    """The class in a few lines: how many are right, each mistake counted, what held each process."""
    n = len(g.rows)
    lines = [f"Right: {g.right} of {n}."] + [f"{what[0].upper()}{what[1:]}: {k} of {n}." for what, k in g.counts()]
    held = g.contained()
    lines.append(f"Each ran in a process of its own ({g.limits}); network: {held.get('network', 'not said')}; "
                 f"files: {held.get('files', 'not said')}.")
    if g.skipped:
        lines.append(f"Skipped, defining no class {g.class_name}: {', '.join(g.skipped)}.")
    return lines


def gradebook_data(g: Gradebook) -> dict:
    """The gradebook as JSON (grades.json and --format json)."""
    return {"command": "verify", "class": g.class_name, "course": g.course, "submissions": len(g.rows),
            "right": g.right, "counts": [{"outcome": what, "students": k} for what, k in g.counts()],
            "limits": g.limits, "contained": g.contained(), "skipped": g.skipped,
            "students": g.rows}


@renderables.register(Gradebook)
def _renderables(g: Gradebook, width: int = 100, **options) -> list:
    return gradebook_renderables(g, width)


@data.register(Gradebook)
def _data(g: Gradebook, **options) -> dict:
    return gradebook_data(g)
