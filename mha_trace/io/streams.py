"""Where the tool's own output goes, kept apart from whatever a user's code prints.

Before a user's module runs, standard output is the tool's. From the first line of user code on
(`guard_stdout`), the tool writes to a private copy of file descriptor 1, while fd 1 itself and
`sys.stdout` point at stderr: a print from a thread the module started, or an `os.write(1, ...)`,
can never land inside --format json. Only the command line turns the guard on
(`guard_for_command_line`): the API, tests and notebooks keep their streams as they were.
"""

import os
import sys

_tool = None  # the private copy of fd 1, once user code has run
_guarding = False  # set by the command line: a library caller's streams are never touched


def guard_for_command_line() -> None:
    """The command line's process: user code's prints will go to stderr, never into the output."""
    global _guarding
    _guarding = True


def tool_stdout():
    """The stream the tool's results are written to."""
    return _tool or sys.stdout


def guard_stdout() -> None:
    """Hand fd 1 and sys.stdout to stderr, keeping a private copy of fd 1 for the tool (once;
    only when sys.stdout really is fd 1 and stderr is there to take the user's prints)."""
    global _tool
    if not _guarding or _tool is not None or sys.stderr is None:
        return
    try:
        if sys.stdout.fileno() != 1:
            return
        stderr = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a captured stream: nothing to guard
        return
    sys.stdout.flush()
    _tool = os.fdopen(os.dup(1), "w", encoding=sys.stdout.encoding, errors=sys.stdout.errors)
    os.dup2(stderr, 1)
    sys.stdout = sys.stderr
