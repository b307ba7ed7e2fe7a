"""The verify view for a student's class (`verify --module`, `mha_trace.verify(module)`): its
run under a course's conventions when one is named, checked against the lecture's module; or a
whole class of submissions, each in a contained process of its own, as a gradebook. The
functions that the command line and the Python API both call."""

from dataclasses import replace

from mha_trace.errors import MhaError


from mha_trace.core.clashes import judge, needs
from mha_trace.views.source import no_bar

CLASHES = (needs("course", "module", "holds a course's conventions for your module"),
           needs("gradebook", "module", "holds a class's verdicts"))
SMALLER = "verify on smaller sizes: the check does not depend on them"


def verify_view(o, given_map: str | None = None, mask_means: str = "any", course: str | None = None,
                gradebook: str | None = None, limits: tuple = (None, None, None), bar=None):
    """What `verify` gives for these options: the built-in module against the references (a
    VerifyReport), a student's class against the lecture's (a StudentReport), or a whole class's
    gradebook (written into `gradebook` when it names a folder). `limits`: (jobs, seconds, GiB)
    for a class; `bar(total, what)` its progress bar."""
    judge({"course": course, "module": o.module, "gradebook": gradebook}, CLASHES)
    if o.module and is_class(o, gradebook):
        if gradebook is not None:
            from mha_trace.io.gradebook import check_gradebook

            check_gradebook(gradebook)  # before any submission runs
        book = class_verdicts(o, given_map, mask_means, course, _limits(*limits), bar or no_bar)
        if gradebook is not None:
            from mha_trace.io.gradebook import write_gradebook
            from mha_trace.render.gradebook import summary_lines

            write_gradebook(gradebook, book.data(), summary_lines(book))
        return book  # its renderer: render.gradebook, imported by class_verdicts
    if tuple(limits) != (None, None, None):
        raise MhaError("--jobs, --time-limit and --memory go with a class: a --module whose file is a "
                       "glob or a folder, or --gradebook")
    verdict = student_verdict(o, given_map, mask_means, course) if o.module else _builtin(o, given_map, mask_means)
    import mha_trace.render.tiled_verify  # noqa: F401 (the renderers of what it returns)
    import mha_trace.render.verify  # noqa: F401
    return verdict


LIMITS = (("jobs", 1, 256, "submissions at once"), ("time_limit", 1, 3600, "seconds each"),
          ("memory", 0.25, 1024, "GiB each"))


def _limits(*given):
    """The class's limits from (jobs, seconds, GiB), each None for its default or checked."""
    from mha_trace.runs.classroom import Limits

    for value, (name, low, high, what) in zip(given, LIMITS):
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if value is not None and not (number and low <= value <= high and (name != "jobs" or type(value) is int)):
            raise MhaError(f"{value!r} is not {what} from {low:g} to {high:g}", quantity=name)
    jobs, seconds, memory = given
    return Limits(seconds or Limits.seconds, int(memory * 2**30) if memory else Limits.memory, jobs or 0)


def _builtin(o, map_: str | None, mask_means: str):
    """The built-in module against the references, at sizes from flags or on a config."""
    from mha_trace.analyses.references import check_references
    from mha_trace.runs.resolve import resolve

    if map_ or o.init or mask_means != "any":
        raise MhaError("--map, --mask-means and --init go with --module")
    if o.config is None:
        run = resolve(o, "sizes", alive=4, hint=SMALLER)
        if o.latent is None:
            return check_references(run)
        from mha_trace.analyses.latent_refs import latent_checks

        return check_references(run, latent_checks)
    fixed = [f for f, v in (("--batch", o.batch), ("--seq", o.seq), ("--d-model", o.d_model),
                            ("--seed", o.seed)) if v is not None]
    if fixed:
        raise MhaError(f"{', '.join(fixed)} {'goes' if len(fixed) == 1 else 'go'} with sizes "
                       f"from flags; a config fixes its tokens, width and seed")
    if o.impl not in (None, "explicit"):
        raise MhaError("impl goes with sizes from flags (a config runs the explicit module)",
                       quantity="impl")
    return check_references(resolve(o, "config"))


def student_verdict(options, given_map: str | None, mask_means: str, course):
    """The student's verdict (a StudentReport): under `course` (a bundled name or a profile's
    .toml path) the profile's mask meaning and sizes, said first in the notes."""
    from mha_trace.runs.course import under_course

    options, mask_means, profile = under_course(options, mask_means, course)
    return _verdict(options, mask_means, profile, given_map)


def _verdict(options, mask_means: str, profile, given_map: str | None):
    if options.impl == "tiled":
        return _tiled(options, profile)
    from mha_trace.analyses.student import check_student
    from mha_trace.runs.student import resolve_student

    if options.latent is not None:  # a student's MLA: its weights read by shape, its mask the lecture's
        from mha_trace.analyses.latent_student import check_latent_student

        report = check_latent_student(resolve_student(options))
        return report if profile is None else profile.said(report)
    report = check_student(resolve_student(options), given_map, mask_means)
    if profile is not None:
        return profile.said(report)
    masked = options.mask not in (None, "none") or options.pad
    if mask_means == "any" and masked and report.passed and not any(n.startswith(MASK_READ) for n in report.notes):
        report.notes.append(AMBIGUOUS)  # right under the lecture's reading: which is the course's?
    return report


def _tiled(options, profile):
    """A student's tiled forward (--impl tiled) against the lecture's walk: Q, K and V of one head,
    (batch, seq, d_model), causal under --mask causal (or the course's)."""
    from mha_trace.analyses.tiled_student import check_tiled
    from mha_trace.runs.usermodule import load_tiled

    for flag in ("heads", "kv_heads", "pad", "rope", "window", "block_q", "block_k", "config"):
        if getattr(options, flag) not in (None, False, 0):
            raise MhaError(f"--{flag.replace('_', '-')} does not go with --impl tiled on your module: it is "
                           f"checked on one head's Q, K and V, at its own tile sizes", quantity=flag)
    call, label, source = load_tiled(options.module)
    shape = (options.batch or 2, options.seq or 64, options.d_model or 16)
    report = check_tiled(call, label, source, shape, options.mask == "causal", options.seed or 0)
    if profile is not None:
        report.notes.insert(0, f"checked under the {profile.name} profile ({profile.title})")
    return report


MASK_READ = ("its mask", "it masks causally")  # the notes that say how the mask was read
AMBIGUOUS = ("its boolean mask was read as True where a query may attend (the lecture's convention); "
             "a course whose mask means the opposite would call it inverted: name the course with "
             "--course, or hold it to one reading with --mask-means")


def is_class(options, gradebook) -> bool:
    """A --module that names many files (a glob or a folder), or one file graded into a gradebook."""
    from mha_trace.runs.classroom import names_many

    module = options.module
    return isinstance(module, str) and ":" in module and (names_many(module.rsplit(":", 1)[0]) or gradebook is not None)


def class_verdicts(options, given_map: str | None, mask_means: str, course, limits, bar):
    """A Gradebook: each submission the --module's glob or folder finds, judged in a contained
    process of its own (`limits`), `bar(total, what)` its progress bar. Everything the lecturer
    names (the course, a config) is read here, once, before any submission runs."""
    from mha_trace.analyses.gradebook import Gradebook, row
    from mha_trace.runs.classroom import find, run_each
    from mha_trace.runs.config import load_config
    from mha_trace.runs.course import under_course

    if options.device not in (None, "cpu"):
        raise MhaError("a class is verified on the CPU, each submission in a process of its own "
                       "(verify one file for --device cuda)", quantity="device")
    pattern, name = options.module.rsplit(":", 1)
    submissions, skipped = find(pattern, name)
    if isinstance(options.config, str):
        options = replace(options, config=load_config(options.config))
    options, mask_means, profile = under_course(options, mask_means, course)
    _imported_once()
    judge = lambda s: _judged(replace(options, module=f"{s.path}:{name}"), mask_means, profile, given_map, s)
    with bar(len(submissions), f"verifying {len(submissions)} submissions") as advance:
        results = run_each(submissions, judge, limits, advance)
    rows = [row(s.student, s.path, r["verdict"]) | r for s, r in zip(submissions, results)]
    import mha_trace.render.gradebook  # noqa: F401 (the renderers of what it returns)
    return Gradebook(name, rows, profile.name if profile else None, limits.said(), skipped)


def _imported_once() -> None:
    """What judging a submission imports, imported here, before the processes are forked: each
    inherits it rather than import it again (torch's ops are never run here)."""
    import mha_trace.analyses.student  # noqa: F401
    import mha_trace.render.verify  # noqa: F401
    import mha_trace.runs.resolve  # noqa: F401
    import mha_trace.runs.run  # noqa: F401


def _judged(options, mask_means: str, profile, given_map: str | None, submission) -> dict:
    """In the submission's own process: its gradebook row."""
    from mha_trace.analyses.gradebook import row

    try:
        report = _verdict(options, mask_means, profile, given_map)
    except MhaError as e:
        message = str(e).replace(submission.path, submission.student + ".py")  # as the class's folder names it
        return row(submission.student, submission.path, "refused", message=message)
    verdict = "right" if report.passed else "variant" if getattr(report, "variant", None) else "wrong"
    return row(submission.student, submission.path, verdict, report.data())
