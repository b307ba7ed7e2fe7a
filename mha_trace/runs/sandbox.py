"""A submission's own process, contained before its code runs (`verify` over a class): a memory
limit, no network, writes only in its scratch folder and reads only the system's and Python's
folders and its own file; and what it tried that it may not, reported even when its code caught
the refusal. Linux's own mechanisms, each used where the kernel has it and said where it has not:
resource limits, a network namespace of its own, Landlock for files, Python's audit hooks to see.
"""

import ctypes
import os
import resource
import sys
import sysconfig

# Landlock (Linux 5.13+): the system calls and the rights (linux/landlock.h)
CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446
READS = 1 << 0 | 1 << 2 | 1 << 3  # execute, read a file, read a folder
ALL_FILES = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1}  # each ABI adds a right
ALL_FILES_LATER = (1 << 16) - 1  # ABI 5 on: and ioctl on devices
FILE_RIGHTS = 1 << 0 | 1 << 1 | 1 << 2 | 1 << 14 | 1 << 15  # the rights a rule on a file may hold
SYSTEM = ("/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin", "/etc", "/proc", "/sys", "/dev", "/opt")


class _Ruleset(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def readable_roots(cwd: str) -> list[str]:
    """The folders a submission may read: the system's and Python's (the interpreter, its standard
    library, site-packages, this tool), never the folder the lecturer runs from nor a home folder."""
    tool = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    paths = set(SYSTEM) | {sys.prefix, sys.base_prefix, sys.exec_prefix, tool}
    paths |= {p for p in sysconfig.get_paths().values()}
    paths |= {p for p in sys.path if p and os.path.isdir(p) and os.path.abspath(p) != cwd}
    return sorted(p for p in paths if os.path.exists(p))


def contain(scratch: str, readable: list[str], memory: int) -> dict:
    """In the submission's process, before its code: what holds, in words ({"memory": ..., "files": ...})."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 20, 64 << 20))  # a file of 64 MiB at most
    resource.setrlimit(resource.RLIMIT_AS, (_mapped() + memory,) * 2)
    held = {"memory": f"{memory / 2**30:g} GiB", "files": _landlock(scratch, readable)}
    os.chdir(scratch)
    os.environ.update(HOME=scratch, TMPDIR=scratch, TMP=scratch, TEMP=scratch)
    return held


def _mapped() -> int:
    """The bytes this process has mapped now (torch's libraries among them): the memory limit
    counts from here."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
    except (OSError, StopIteration, ValueError):
        return 0


def own_namespaces() -> tuple[str, bool]:
    """(the network in words, whether its processes are counted apart): a network namespace of
    its own (no interface but a loopback that is down) and a process namespace, whose processes all
    end when its first one does; entered through a user namespace, so no privilege is needed."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x40000000 | 0x20000000) != 0:  # CLONE_NEWUSER | NEWNET | NEWPID
        return f"not cut off: this system refuses a network namespace ({os.strerror(ctypes.get_errno())})", False
    for name, text in (("uid_map", f"{uid} {uid} 1"), ("setgroups", "deny"), ("gid_map", f"{gid} {gid} 1")):
        try:
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        except OSError:
            pass  # unmapped, it runs as nobody: it still runs
    return "none (a network namespace of its own)", True


def _landlock(scratch: str, readable: list[str]) -> str:
    """Landlock's rules for this process and any it starts: write only beneath `scratch`, read
    only beneath `readable`; said in words where the kernel has no Landlock."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        return "not contained: this kernel has no Landlock (Linux 5.13 or later has it)"
    handled = ALL_FILES.get(abi, ALL_FILES_LATER)
    attr = _Ruleset(handled, 0)
    ruleset = libc.syscall(CREATE_RULESET, ctypes.byref(attr), ctypes.sizeof(ctypes.c_uint64), 0)
    if ruleset < 0:
        return f"not contained: Landlock refused a ruleset ({os.strerror(ctypes.get_errno())})"
    try:
        for path, rights in [(p, READS) for p in readable] + [(scratch, handled), ("/dev/null", 1 << 1 | 1 << 2)]:
            _allow(libc, ruleset, path, rights & handled)
        if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(RESTRICT_SELF, ruleset, 0) != 0:  # PR_SET_NO_NEW_PRIVS
            return f"not contained: Landlock refused ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ruleset)
    return "written only in its scratch folder; read only from the system's and Python's folders and its own file (Landlock)"


def _allow(libc, ruleset: int, path: str, rights: int) -> None:
    """One rule: `rights` beneath `path` (a file's rule holds only the rights a file has)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return
    try:
        if not os.path.isdir(path):
            rights &= FILE_RIGHTS
        rule = _PathBeneath(rights, fd)
        libc.syscall(ADD_RULE, ruleset, 1, ctypes.byref(rule), 0)  # LANDLOCK_RULE_PATH_BENEATH
    finally:
        os.close(fd)


SEEN = {"open", "os.remove", "os.rmdir", "os.rename", "shutil.rmtree", "socket.connect", "socket.bind",
        "subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.fork", "os.kill"}


def watch(scratch: str, readable: list[str], source: str, said: list) -> None:
    """Python's audit hook: each thing the submission's code (`source`, on the stack) tries that
    goes beyond its scratch folder (a write, a read of a folder it may not read, a deletion, a
    connection, a process) is said in `said`, whether or not its code caught the refusal."""
    inside = lambda path: os.path.abspath(path).startswith((scratch + os.sep, "/dev/null"))
    roots = tuple(r.rstrip("/") + "/" for r in readable)
    may_read = lambda path: inside(path) or (os.path.abspath(path) + "/").startswith(roots)
    sys.path[:] = [p for p in sys.path if p and may_read(p)]  # nothing looked for where it may not look

    def hook(event: str, args: tuple) -> None:
        if event not in SEEN or len(said) >= 20:
            return
        what = _attempt(event, args, inside, may_read)
        if what and what not in said and _called_by(source):
            said.append(what)

    sys.addaudithook(hook)


def _called_by(source: str) -> bool:
    """Whether the submission's own code is on the stack (not the tool's, nor Python's)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == source:
            return True
        frame = frame.f_back
    return False


def _attempt(event: str, args: tuple, inside, may_read) -> str | None:
    """An audit event in words, or None where it stays inside what the submission may do."""
    if event == "open":
        path, mode = args[0], args[1] or "r"
        if not isinstance(path, (str, bytes)):
            return None
        path = os.fsdecode(path)
        writes = any(c in str(mode) for c in "wax+") or (isinstance(args[2], int) and args[2] & 3)
        if writes and not inside(path):
            return f"wrote {path}"
        return None if writes or may_read(path) else f"read {path}"
    if event in ("os.remove", "os.rmdir", "shutil.rmtree", "os.rename"):
        path = os.fsdecode(args[0]) if isinstance(args[0], (str, bytes)) else str(args[0])
        return None if inside(path) else f"deleted or moved {path}"
    if event in ("socket.connect", "socket.bind"):
        return f"{'connected' if event == 'socket.connect' else 'bound'} a socket to {args[1]!r}"
    if event == "os.kill":
        return None if args[0] in (0, os.getpid()) else f"sent a signal to process {args[0]}"
    return f"started a process ({event})"
