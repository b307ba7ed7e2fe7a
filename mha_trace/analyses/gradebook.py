"""A class's gradebook: each submission's verdict, line, mistake and fix, and the class's mistakes
counted ("12 of 40 scaled by d_k instead of √d_k")."""

from collections import Counter
from dataclasses import dataclass, field

from mha_trace.records import Shows

VERDICTS = {"right": "Right", "wrong": "Wrong", "variant": "Variant", "refused": "Refused", "stopped": "Stopped"}
NO_KNOWN_MISTAKE = "none of the known mistakes"


@dataclass
class Gradebook(Shows):
    """Every submission's row, in the order found; prints as a table and the class's counts."""

    class_name: str
    rows: list  # one dict per submission (see `row`)
    course: str | None = None
    limits: str = ""  # each process's limits in words
    skipped: list = field(default_factory=list)  # a folder's files that define no such class

    @property
    def passed(self) -> bool:
        """A class's run ends well once every submission is judged, whatever its verdicts."""
        return True

    @property
    def right(self) -> int:
        return sum(r["verdict"] == "right" for r in self.rows)

    def counts(self) -> list:
        """(what, how many students) for each outcome beyond Right: each mistake named, each
        variant, each refusal and each stop, most frequent first."""
        seen = Counter(_outcome(r) for r in self.rows if r["verdict"] != "right")
        return sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))

    def contained(self) -> dict:
        """What held in the submissions' processes ({"network": ..., "files": ..., "memory": ...}),
        as the first process to say it found it."""
        return next((r["contained"] for r in self.rows if r.get("contained")), {})


def _outcome(row: dict) -> str:
    if row["verdict"] in ("wrong", "variant"):
        return row["mistake"] or NO_KNOWN_MISTAKE
    if row["verdict"] == "stopped":  # by its kind: "stopped, at its time limit"
        return "stopped, " + (row["message"] or "").split(":")[0]
    return "refused: it could not be run and checked"


def row(student: str, file: str, verdict: str, report: dict | None = None, message: str | None = None) -> dict:
    """One submission's row, flat, from its verify report's JSON (or the refusal's message)."""
    report = report or {}
    step = report.get("first_wrong_step") or {}
    mistake = report.get("diagnosis") or report.get("variant") or (NO_KNOWN_MISTAKE if verdict == "wrong" else None)
    undefined = {k: v for k, v in report.items() if k == "output_max_abs_diff_undefined"}
    return {"student": student, "file": file, "verdict": verdict, "line": step.get("line"),
            "source": step.get("source"), "mistake": mistake, "fix": report.get("fix"),
            "output_max_abs_diff": report.get("output_max_abs_diff"), **undefined,
            "reading": report.get("reading"), "notes": report.get("notes", []), "message": message}
