"""A course's conventions as a profile (`verify --course cs231n`, or a TOML file of one's own):
what its mask means, whether it is causal, the sizes its checks use. Under a profile a mask read
the other way round is Wrong, where without one either reading is accepted and the one that
matched is said. Read with the standard library's tomllib; no torch."""

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from mha_trace.errors import MhaError, printable

COURSES = Path(__file__).resolve().parent.parent / "courses"
KEYS = {"title": str, "convention": str, "mask_means": str, "mask": str, "d_model": int,
        "heads": int, "seq": int, "batch": int}


@dataclass(frozen=True)
class Course:
    name: str
    title: str
    convention: str = ""
    mask_means: str | None = None  # "keep" | "blocked"; None: the course passes no boolean mask
    mask: str | None = None  # "none" | "causal": the mask its checks use
    d_model: int | None = None
    heads: int | None = None
    seq: int | None = None
    batch: int | None = None

    def said(self, report):
        """The report told which profile judged it; a mask read the other way round is fixed in
        the course's own words (its mask may mean True where a query may NOT look)."""
        report.notes[:0] = [f"checked under the {self.name} profile ({self.title})"
                            + (f": {self.convention}" if self.convention else "")]
        report.notes = [n for n in report.notes if not n.startswith("its mask means True where a query may NOT")]
        if report.diagnosis == "mask inverted" and self.mask_means:
            report.own_fix = (f"fill where the mask is True: in {self.name} True means a query may NOT look"
                          if self.mask_means == "blocked" else f"fill where the mask is False "
                          f"(== 0): in {self.name} True (nonzero) means a query may look")
        return report


def course_names() -> list[str]:
    return sorted(p.stem for p in COURSES.glob("*.toml"))


def read_course(given: str) -> Course:
    """A bundled course by name, or a profile's TOML file by path, each key checked."""
    path = COURSES / f"{given}.toml" if given in course_names() else Path(given)
    if not given.endswith(".toml") and given not in course_names():
        raise MhaError(f"'{printable(given)}' is not a bundled course ({', '.join(course_names())}) "
                       f"or a profile's .toml file", quantity="course")
    try:
        found = tomllib.loads(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise MhaError(f"{printable(given)} cannot be read ({getattr(e, 'strerror', None) or e})",
                       quantity="course") from None
    except tomllib.TOMLDecodeError as e:
        raise MhaError(f"{printable(given)} is not valid TOML ({e})", quantity="course") from None
    for key, value in found.items():
        if key not in KEYS:
            raise MhaError(f"{printable(given)}: key '{printable(key)}' is not one of "
                           f"{', '.join(KEYS)}", quantity="course")
        if type(value) is not KEYS[key]:
            raise MhaError(f"{printable(given)}: {key} is a {KEYS[key].__name__}, got {value!r}",
                           quantity="course")
    if found.get("mask_means", "keep") not in ("keep", "blocked"):
        raise MhaError(f"{printable(given)}: mask_means is 'keep' or 'blocked'", quantity="course")
    if found.get("mask", "none") not in ("none", "causal"):
        raise MhaError(f"{printable(given)}: mask is 'none' or 'causal'", quantity="course")
    return Course(name=path.stem if given in course_names() else printable(path.name),
                  **{"title": path.stem, **found})


def under_course(options, mask_means: str, given: str | None) -> tuple:
    """(the run's options, the mask's meaning, the course) with the profile's conventions put in
    where the command line left them open; a --mask-means that contradicts it is refused."""
    if given is None:
        return options, mask_means, None
    course = read_course(given)
    if mask_means != "any" and course.mask_means and mask_means != course.mask_means:
        raise MhaError(f"--mask-means {mask_means} contradicts the {course.name} profile's "
                       f"({course.mask_means}): leave one out", quantity="mask_means")
    sizes = {key: getattr(course, key) for key in ("mask", "d_model", "heads", "seq", "batch")
             if getattr(options, key) is None and getattr(course, key) is not None}
    return replace(options, **sizes), course.mask_means or mask_means, course
