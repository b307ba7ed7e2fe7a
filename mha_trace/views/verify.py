"""The verify view for a student's class (`verify --module`, `mha_trace.verify(module)`): its
run under a course's conventions when one is named, checked against the lecture's module; one
function that the command line and the Python API both call."""


def student_verdict(options, given_map: str | None, mask_means: str, course: str | None):
    """The student's verdict (a StudentReport): under `course` (a bundled name or a profile's
    .toml path) the profile's mask meaning and sizes, said first in the notes."""
    from mha_trace.analyses.student import check_student
    from mha_trace.runs.course import under_course
    from mha_trace.runs.resolve import resolve_student

    options, mask_means, profile = under_course(options, mask_means, course)
    report = check_student(resolve_student(options), given_map, mask_means)
    if profile is not None:
        return profile.said(report)
    masked = options.mask not in (None, "none") or options.pad
    if mask_means == "any" and masked and report.passed and not any(n.startswith(MASK_READ) for n in report.notes):
        report.notes.append(AMBIGUOUS)  # right under the lecture's reading: which is the course's?
    return report


MASK_READ = ("its mask", "it masks causally")  # the notes that say how the mask was read
AMBIGUOUS = ("its boolean mask was read as True where a query may attend (the lecture's convention); "
             "a course whose mask means the opposite would call it inverted: name the course with "
             "--course, or hold it to one reading with --mask-means")
