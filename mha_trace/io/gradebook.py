"""A class's gradebook written into one folder (`verify --gradebook DIR`): grades.csv for a
spreadsheet, grades.json (as --format json prints it), results.json in Gradescope's autograder
format, and grades.html, one page a lecturer can open. Every text in them is the students': the
page escapes it and runs no script."""

import csv
import html
import io
import os

from mha_trace.errors import MhaError, printable
from mha_trace.io.files import write_atomic
from mha_trace.io.output import to_json

COLUMNS = ("student", "verdict", "line", "mistake", "fix", "message", "output_max_abs_diff", "file")
FILES = ("grades.csv", "grades.json", "results.json", "grades.html")


def check_gradebook(folder: str) -> None:
    """Before a class runs: a folder that is there, or can be made in one that is."""
    if not isinstance(folder, str) or not folder.strip():
        raise MhaError("give a folder for the gradebook, e.g. --gradebook grades/", quantity="gradebook")
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise MhaError(f"{printable(folder)} is a file; give a folder, e.g. grades/", quantity="gradebook")
    parent = os.path.dirname(os.path.abspath(folder))
    if not os.path.isdir(parent):
        raise MhaError(f"cannot make {printable(folder)}: {printable(parent)} is not a folder", quantity="gradebook")


def write_gradebook(folder: str, data: dict, summary: list[str]) -> None:
    """The four files into `folder` (made if it is not there)."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        raise MhaError(f"cannot make {printable(folder)}: {e.strerror or e}", quantity="gradebook") from None
    if not os.path.isdir(folder):
        raise MhaError(f"{printable(folder)} is not a folder", quantity="gradebook")
    for name, text in zip(FILES, (_csv(data), to_json(data) + "\n", to_json(gradescope(data, summary)) + "\n",
                                  _html(data, summary))):
        write_atomic(os.path.join(folder, name), text, "gradebook")


def _csv(data: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS + ("contained",))
    for r in data["students"]:
        writer.writerow([_cell(r.get(c)) for c in COLUMNS] + ["; ".join(r.get("attempts") or [])])
    return out.getvalue()


def _cell(value) -> str:
    """A value as a spreadsheet cell; text that a spreadsheet would run as a formula is quoted."""
    text = "" if value is None else str(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") and not _number(text) else text


def _number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def gradescope(data: dict, summary: list[str]) -> dict:
    """Gradescope's results.json: one test per submission, 1 point when Right. For one submission
    (Gradescope runs the autograder once per student) it is that student's results.json."""
    tests = [{"name": r["student"], "score": int(r["verdict"] == "right"), "max_score": 1,
              "status": "passed" if r["verdict"] == "right" else "failed", "output": _said(r)}
             for r in data["students"]]
    return {"score": sum(t["score"] for t in tests), "output": "\n".join(summary), "tests": tests}


def _said(r: dict) -> str:
    """A submission's verdict as its student reads it."""
    lines = [r["verdict"].capitalize() + (f" at line {r['line']}: {r['source']}" if r.get("line") is not None else ".")]
    lines += [f"{label}: {r[key]}" for label, key in (("Mistake", "mistake"), ("Fix", "fix"), ("Why", "message"))
              if r.get(key)]
    return "\n".join(lines + list(r.get("notes") or []))


def happened(r: dict) -> list:
    """A row's mistake (or why it was not checked), and what it tried that it may not."""
    mistake = r.get("mistake") and r["mistake"] + (f" (at the first wrong step {r['reading']})" if r.get("reading") else "")
    return [t for t in (mistake or r.get("message"),
                        r.get("attempts") and "contained: it " + ", ".join(r["attempts"])) if t]


PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<style>body{{font:16px/1.4 system-ui,sans-serif;margin:2em;max-width:70em}}
table{{border-collapse:collapse;width:100%}}th,td{{text-align:left;padding:.3em .6em;border-bottom:1px solid #ccc;
vertical-align:top}}code{{font-size:90%}}.right{{color:#1a7f37}}.wrong{{color:#cf222e;font-weight:bold}}
.variant{{color:#9a6700}}.refused,.stopped{{color:#8250df;font-weight:bold}}</style></head>
<body><h1>{title}</h1>
<h2>The class</h2><ul>{summary}</ul>
<h2>Each submission</h2>
<table><thead><tr><th>student</th><th>verdict</th><th>line</th><th>mistake, or why not checked</th><th>fix</th></tr></thead>
<tbody>{rows}</tbody></table></body></html>
"""


def _html(data: dict, summary: list[str]) -> str:
    e = lambda x: html.escape("" if x is None else str(x))
    rows = "".join(
        f'<tr><td>{e(r["student"])}</td><td class="{e(r["verdict"])}">{e(r["verdict"].capitalize())}</td>'
        f'<td>{e(r["line"]) if r.get("line") is not None else "—"}'
        f'{"<br><code>" + e(r["source"]) + "</code>" if r.get("source") else ""}</td>'
        f'<td>{"<br>".join(e(t) for t in happened(r))}</td>'
        f'<td>{e(r.get("fix") or "")}</td></tr>' for r in data["students"])
    course = f", under the {data['course']} profile" if data.get("course") else ""
    title = f"verify: {data['submissions']} submissions of {data['class']}{course}"
    return PAGE.format(title=e(title), summary="".join(f"<li>{e(s)}</li>" for s in summary), rows=rows)
