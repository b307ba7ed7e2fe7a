"""Render `verify`: each reference, what it compares, the largest difference and the verdict."""

import math
from pathlib import Path

import torch
from rich.text import Text

from mha_trace.io.output import new_table, undefined_or
from mha_trace.records import data, renderables
from mha_trace.analyses.references import VerifyReport
from mha_trace.analyses.verdict import StudentReport


UNDEFINED = ("max |diff| is undefined where one side holds NaN (not a number) or an infinity: a row "
             "whose every key is masked divides 0 by 0")


def _diff(x: float | None) -> str:
    """A difference as the table writes it: "—" where nothing is compared, a word where it is
    undefined (a NaN or an infinity on one side), else its value."""
    return "—" if x is None else "undefined" if not math.isfinite(x) else f"{x:.2e}"


def _diff_data(key: str, x: float | None) -> dict:
    return {key: x} if x is None or math.isfinite(x) else undefined_or(key, None, 0, UNDEFINED)


def verify_renderables(report, width: int = 100) -> list:
    """The checks as a table; below 120 columns the notes go under it, numbered, rather than be
    squeezed out."""
    inline = width >= 120
    table = new_table(f"verify: {report.description}, {report.dtype} on {report.device}")
    longest = max(len(w) for c in report.checks for w in c.reference.split())
    table.add_column("reference", min_width=longest)  # never cut a name
    table.add_column("compares", min_width=len("per-head weights"), no_wrap=True)
    table.add_column("max |diff|", justify="right", no_wrap=True)
    table.add_column("tolerance", justify="right", no_wrap=True)
    table.add_column("result", no_wrap=True)
    if inline:
        table.add_column("note", ratio=1)
    notes = []
    for c in report.checks:
        result = {True: Text("pass", style="green"), False: Text("FAIL", style="bold red"),
                  None: Text("n/a", style="dim")}[c.passed]
        if c.note and not inline:
            notes.append(c.note)
        if not inline and c.note:
            result = result + Text(f" [{len(notes)}]")
        table.add_row(c.reference, c.compares, _diff(c.max_abs),
                      f"{c.tolerance:.0e}", result, *([c.note] if inline else []))
    verdict = "All comparisons pass." if report.passed else "Some comparisons FAIL (exit code 1)."
    undefined = [UNDEFINED + "."] if any(_diff(c.max_abs) == "undefined" for c in report.checks) else []
    lines = [f"[{i}] {n}" for i, n in enumerate(notes, 1)] + undefined + [verdict]
    return [table, Text("\n".join(lines), style="bold")]


def verify_data(report) -> dict:
    return {"command": "verify", "description": report.description, **(report.settings or {}),
            "dtype": report.dtype, "device": report.device, "passed": report.passed,
            "checks": [{"reference": c.reference, "compares": c.compares, **_diff_data("max_abs_diff", c.max_abs),
                        "tolerance": c.tolerance, "passed": c.passed, "note": c.note}
                       for c in report.checks]}


def _values(t, at: int = 0) -> str:
    """Four values from flat position at - 1 (the first difference, with one before it)."""
    if t is None:
        return "—"
    flat = t.detach().double().flatten()
    start = max(0, at - 1)
    shown = ", ".join(f"{x:.4f}" for x in flat[start:start + 4].tolist())
    return "[" + ("…, " if start else "") + shown + (", …]" if start + 4 < flat.numel() else "]")


def _first_difference(yours, theirs) -> int | None:
    """The flat position where two tensors of one shape first differ (None: they do not, or
    their shapes differ)."""
    if yours is None or theirs is None or tuple(yours.shape) != tuple(theirs.shape):
        return None
    a, b = yours.detach().double().flatten(), theirs.detach().double().flatten()
    far = (~torch.isclose(a, b, rtol=1e-6, atol=1e-9, equal_nan=True)).nonzero()
    return int(far[0]) if len(far) else None


def student_renderables(r) -> list:

    table = new_table(f"verify: {r.label} against the lecture's module, the same weights and input "
                      f"(float64)")
    table.add_column("compares")
    table.add_column("max |diff|", justify="right", no_wrap=True)
    table.add_column("tolerance", justify="right", no_wrap=True)
    table.add_column("result", no_wrap=True)
    verdict = lambda d: Text("n/a", style="dim") if d is None else (
        Text("pass", style="green") if d <= r.tolerance else Text("FAIL", style="bold red"))
    table.add_row("output", _diff(r.output_diff), f"{r.tolerance:.0e}", verdict(r.output_diff))
    table.add_row("per-head weights", _diff(r.weights_diff), f"{r.tolerance:.0e}", verdict(r.weights_diff))
    if r.mapping.startswith("(projections none: the config's"):
        found = f"Fed {r.mapping[len('(projections none: '):-1]}"
    elif r.mapping.startswith("(projections none"):
        found = f"Projections: {r.mapping[len('(projections '):-1]}"
    else:
        found = (f"Projections found {r.mapping.split(' (')[-1].rstrip(')')}: "
                 f"{r.mapping.rsplit(' (', 1)[0]}")
    lines = [f"{found}; called as {r.fed}."] + [n[0].upper() + n[1:] + "." for n in r.notes]
    if r.weights_diff is None:
        lines.append("It returns no per-head weights, so only its output is compared.")
    if "undefined" in (_diff(r.output_diff), _diff(r.weights_diff)):
        lines.append(UNDEFINED + ".")
    if r.passed:
        lines.append("Right: it computes what the lecture's module computes.")
        return [table, Text("\n".join(lines))]
    if r.variant:
        from mha_trace.io.output import display_path

        f = r.first_wrong
        lines += [f"Variant at {display_path(f.file)}:{f.line}  {f.source}",
                  f"  {r.variant[0].upper()}{r.variant[1:]}: a variant of the chapter's attention, "
                  f"so its numbers differ from the chapter's; not a mistake.",
                  "Not the lecture's module: a variant (exit code 1)."]
        return [table, Text("\n".join(lines))]
    lines += _first_wrong_lines(r)
    lines.append(f"Diagnosis: {r.diagnosis}." if r.diagnosis else
                 "Diagnosis: none of the known mistakes gives this output exactly"
                 + (f"; at the first wrong step {r.reading}." if r.reading else "."))
    if r.fix:
        lines.append(f"Fix: {r.fix}.")
    lines.append("Wrong (exit code 1).")
    return [table, Text("\n".join(lines))]


def _first_wrong_lines(r) -> list:
    """Where the student's computation first does a job differently, beside the lecture's step."""
    from mha_trace.io.output import display_path

    f, ref = r.first_wrong, r.reference_step
    if f is None:
        return ["Every step's numbers appear in the lecture's computation, but forward returns a "
                "different tensor as its output."]
    lines = [f"First wrong step: {display_path(f.file)}:{f.line}  {f.source}"]
    if f.called_from:
        lines.append(f"  called from line {f.called_from[0]}  {f.called_from[1]}")
    at = _first_difference(f.value, ref.value if ref else None)
    lines += [f"  yours: {f.op} {list(f.shape)} {_values(f.value, at or 0)}",
              "  the lecture's: " + (f"{ref.op} {list(ref.shape)} {_values(ref.value, at or 0)} "
                                      f"({Path(ref.file).name}:{ref.line} {ref.source})" if ref else "—")]
    if at is not None:
        index = [int(i) for i in torch.unravel_index(torch.tensor(at), tuple(f.shape))]
        lines.append(f"  first different at {index}: yours {float(f.value.flatten()[at]):.4f}, "
                     f"the lecture's {float(ref.value.flatten()[at]):.4f}")
    if r.missing:
        lines.append(f"  {r.missing[0].upper()}{r.missing[1:]}.")
    return lines


def student_data(r) -> dict:
    f = r.first_wrong
    return {"command": "verify", "module": r.label, "mapping": r.mapping, "call": r.fed,
            "passed": r.passed, **_diff_data("output_max_abs_diff", r.output_diff),
            **_diff_data("weights_max_abs_diff", r.weights_diff), "tolerance": r.tolerance,
            "first_wrong_step": None if f is None else {
                "line": f.line, "source": f.source, "op": f.op, "shape": list(f.shape),
                "called_from": f.called_from[0] if f.called_from else None,
                "missing_after_it": r.missing},
            "diagnosis": r.diagnosis, "fix": r.fix, "variant": r.variant, "reading": r.reading, "notes": r.notes}


@renderables.register(VerifyReport)
def _verify(report, width: int, **_) -> list:
    return verify_renderables(report, width)


@data.register(VerifyReport)
def _verify_data(report, **_) -> dict:
    return verify_data(report)


@renderables.register(StudentReport)
def _student(report, width: int, **_) -> list:
    return student_renderables(report)


@data.register(StudentReport)
def _student_data(report, **_) -> dict:
    return student_data(report)
