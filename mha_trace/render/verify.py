"""Render `verify`: each reference, what it compares, the largest difference and the verdict."""

from rich.text import Text

from mha_trace.output import new_table


def verify_renderables(report) -> list:
    table = new_table(f"verify: {report.description}, {report.dtype} on {report.device}")
    table.add_column("reference", overflow="fold")
    table.add_column("compares", overflow="fold")
    table.add_column("max |diff|", justify="right", no_wrap=True)
    table.add_column("tolerance", justify="right", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("note", overflow="fold", ratio=1)
    for c in report.checks:
        result = {True: Text("pass", style="green"), False: Text("FAIL", style="bold red"),
                  None: Text("n/a", style="dim")}[c.passed]
        table.add_row(c.reference, c.compares, "—" if c.max_abs is None else f"{c.max_abs:.2e}",
                      f"{c.tolerance:.0e}", result, c.note)
    verdict = "All comparisons pass." if report.passed else "Some comparisons FAIL (exit code 1)."
    return [table, Text(verdict, style="bold")]


def verify_data(report) -> dict:
    return {"command": "verify", "description": report.description, "dtype": report.dtype,
            "device": report.device, "passed": report.passed,
            "checks": [{"reference": c.reference, "compares": c.compares, "max_abs_diff": c.max_abs,
                        "tolerance": c.tolerance, "passed": c.passed, "note": c.note}
                       for c in report.checks]}
