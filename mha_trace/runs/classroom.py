"""A whole class at once (`verify --module 'class/*.py:Name'`): each submission runs in a process of
its own, forked from this one (torch is imported once), contained before its code runs (sandbox.py),
stopped at its time limit, and its verdict comes back as JSON through a pipe. This process never
runs a submission's code, and its files are never a submission's to write."""

import glob
import json
import os
import re
import select
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

from mha_trace.errors import MhaError, printable
from mha_trace.runs.sandbox import contain, own_namespaces, readable_roots, watch

GLOB = re.compile(r"[*?\[]")
OVER_MEMORY = ("can't allocate memory", "Cannot allocate memory", "MemoryError", "out of memory")
SIGNALS: dict[int, str] = {signal.SIGXCPU: "ran past its time limit (CPU)", signal.SIGXFSZ: "wrote a file over 64 MiB",
                           signal.SIGSEGV: "crashed (a segmentation fault)", signal.SIGABRT: "crashed (aborted)",
                           signal.SIGBUS: "crashed (a bus error)",
                           signal.SIGFPE: "crashed (a floating-point exception)"}


@dataclass(frozen=True)
class Submission:
    student: str  # its path under the class's folder, without .py: "alice" or "alice/attention"
    path: str  # absolute
    alone: bool  # no other submission shares its folder: it may read its folder (its helpers)


@dataclass(frozen=True)
class Limits:
    seconds: float = 30.0  # each submission's wall-clock time
    memory: int = 4 << 30  # bytes each may allocate
    jobs: int = 0  # submissions at once (0: one per core)

    def said(self) -> str:
        return f"{self.seconds:g} s and {self.memory / 2**30:g} GiB each"


def names_many(pattern: str) -> bool:
    """A --module's file part that names many files: a glob or a folder."""
    return bool(GLOB.search(pattern)) or os.path.isdir(pattern)


def find(pattern: str, class_name: str) -> tuple[list[Submission], list[str]]:
    """(submissions, skipped): a glob's every .py file, or a folder's .py files (at any depth) that
    define `class_name`; the folder's others (helpers) are skipped, by name."""
    if os.path.isdir(pattern):
        files = sorted(glob.glob(os.path.join(glob.escape(pattern), "**", "*.py"), recursive=True))
        defines = re.compile(rf"^\s*class\s+{re.escape(class_name)}\b", re.M)
        chosen = [f for f in files if defines.search(_text(f))]
        skipped = [f for f in files if f not in chosen]
    else:
        chosen, skipped = sorted(f for f in glob.glob(pattern, recursive=True) if os.path.isfile(f)), []
    if not chosen:
        where = f"no .py file in {pattern} defines class {class_name}" if os.path.isdir(pattern) \
            else f"no file matches {pattern}"
        raise MhaError(printable(where), quantity="module")
    paths = [os.path.realpath(f) for f in chosen]
    root = os.path.commonpath([os.path.dirname(p) for p in paths])
    folders = [os.path.dirname(p) for p in paths]
    return [Submission(os.path.splitext(os.path.relpath(p, root))[0], p, folders.count(os.path.dirname(p)) == 1)
            for p in paths], [os.path.relpath(f, pattern) for f in skipped]


def _text(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read(1 << 20)
    except OSError:
        return ""


def run_each(submissions: list, judge, limits: Limits, advance=lambda: None) -> list[dict]:
    """Each submission's `judge(submission)` (a dict), run in a contained process of its own,
    `limits.jobs` at once; a submission stopped or crashed gets {"verdict": "stopped", ...}."""
    if not hasattr(os, "fork"):
        raise MhaError("a class is verified in processes of its own, forked: Linux or macOS", quantity="module")
    jobs = limits.jobs or (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    results: list = [None] * len(submissions)
    waiting, running = list(enumerate(submissions)), dict[int, list]()
    with tempfile.TemporaryDirectory(prefix="mha-trace-class-") as room:
        readable = readable_roots(os.getcwd())
        try:
            while waiting or running:
                while waiting and len(running) < max(1, jobs):
                    i, submission = waiting.pop(0)
                    fd, pid = _start(i, submission, judge, limits, room, readable)
                    running[fd] = [i, pid, time.monotonic(), b""]
                _collect(running, results, limits, room, advance)
        finally:  # Ctrl-C, or any failure of ours: no submission's process outlives the run
            for fd, (_, pid, _, _) in running.items():
                _end(pid)
                os.close(fd)
    return results


def _end(pid: int) -> int:
    """Stop a submission's process group and reap it: its wait status."""
    try:
        os.killpg(pid, signal.SIGKILL)  # it and anything it started
    except (ProcessLookupError, PermissionError):
        pass
    return os.waitpid(pid, 0)[1]


def _start(i: int, submission: Submission, judge, limits: Limits, room: str, readable: list) -> tuple:
    """Fork the submission's process: (the read end of the pipe its verdict comes back through, its pid)."""
    scratch = os.path.join(room, f"scratch-{i}")
    os.mkdir(scratch, 0o700)
    printed = os.open(os.path.join(room, f"printed-{i}.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    read, write = os.pipe()
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the submission's process: it never returns
        os.close(read)
        _child(submission, judge, limits, scratch, readable, printed, write)
    os.close(write)
    os.close(printed)
    os.set_blocking(read, False)
    return read, pid


def _child(submission: Submission, judge, limits: Limits, scratch: str, readable: list, printed: int, write: int):
    """Run in the forked process: contain it, judge the submission, send the verdict, exit."""
    try:
        os.setsid()  # a process group of its own: stopped with whatever it starts
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0), os.dup2(printed, 1), os.dup2(printed, 2)
        sys.stdout = open(1, "w", closefd=False, errors="replace")  # never this process's locked buffers
        sys.stderr = open(2, "w", closefd=False, errors="replace")
        network, apart = own_namespaces()
        if apart and os.fork():  # this process waits outside; its child, the first of its own
            _end_as_child()      # process namespace, runs the submission: all it starts ends with it
        own = [submission.path] + ([os.path.dirname(submission.path)] if submission.alone else [])
        held, attempts = dict(contain(scratch, readable + own, limits.memory), network=network), list[str]()
        import resource

        resource.setrlimit(resource.RLIMIT_CPU, (int(limits.seconds) + 2,) * 2)
        watch(scratch, readable + own, submission.path, attempts)
        from mha_trace.core.runtime import one_thread

        with one_thread():  # one submission a core
            row = dict(judge(submission), attempts=attempts, contained=held)
    except BaseException as e:  # the tool's own failure here: said as such, never a traceback
        row = {"verdict": "stopped", "message": f"unexpected {type(e).__name__}: {printable(str(e))}"}
    try:
        sys.stdout.flush(), sys.stderr.flush()
        data = json.dumps(row, default=str).encode()
        while data:
            data = data[os.write(write, data):]
    finally:
        os._exit(0)


def _end_as_child() -> None:
    """Wait for the one child and end as it ended: the same exit status, or the same signal."""
    try:
        _, status = os.wait()
        if os.WIFSIGNALED(status):
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(os.waitstatus_to_exitcode(status))
    finally:
        os._exit(1)


def _collect(running: dict, results: list, limits: Limits, room: str, advance) -> None:
    """Read what the running processes sent until one ends or the nearest deadline passes."""
    now = time.monotonic()
    wait = max(0.0, min(started + limits.seconds for _, _, started, _ in running.values()) - now)
    ready, _, _ = select.select(list(running), [], [], min(wait, 1.0))
    for fd in ready:
        chunk = _read(fd)
        if chunk is None:
            continue
        if chunk:
            running[fd][3] += chunk
            if len(running[fd][3]) <= 1 << 22:
                continue
        _finish(fd, running.pop(fd), results, limits, room, stopped=None)
        advance()
    for fd, (i, pid, started, sent) in list(running.items()):
        if time.monotonic() - started > limits.seconds:
            _finish(fd, running.pop(fd), results, limits, room,
                    stopped=f"at its time limit: still running after {limits.seconds:g} s")
            advance()


def _read(fd: int) -> bytes | None:
    """What came through the pipe: b"" at its end, None where nothing has come yet."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


def _finish(fd: int, entry: list, results: list, limits: Limits, room: str, stopped: str | None) -> None:
    """The submission's verdict, or why it has none; its process group ended, its scratch gone."""
    i, pid, _, sent = entry
    os.close(fd)
    status = _end(pid)
    row = None if stopped else _parsed(sent)
    if row is None:
        row = {"verdict": "stopped", "message": stopped or _why_ended(status)}
    elif row.get("verdict") == "refused" and any(w in row.get("message", "") for w in OVER_MEMORY):
        row.update(verdict="stopped", message=f"over its memory limit ({limits.memory / 2**30:g} GiB): {row['message']}")
    row["printed"] = _tail(os.path.join(room, f"printed-{i}.txt"))
    results[i] = row


def _parsed(sent: bytes) -> dict | None:
    try:
        row = json.loads(sent.strip() or b"null")
    except ValueError:
        return None
    return row if isinstance(row, dict) and "verdict" in row else None


def _why_ended(status: int) -> str:
    """Why a process ended without a verdict, in words."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in SIGNALS:
            return SIGNALS[sig]
        return f"killed by {signal.Signals(sig).name}" + (" (the system does so when memory runs out)"
                                                         if sig == signal.SIGKILL else "")
    return f"ended without a verdict (exit status {os.waitstatus_to_exitcode(status)})"


def _tail(path: str, size: int = 2000) -> str:
    """The last `size` characters the submission printed (its own prints and warnings)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""
