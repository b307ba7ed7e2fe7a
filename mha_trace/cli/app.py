"""The Typer app, its error handling and the console-script entry point."""

import os
import re
import signal
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

from mha_trace import __version__, speedups

from mha_trace.cli import coercion
from mha_trace.io import streams
from mha_trace.errors import MhaError, Terminated, printable
from mha_trace.io.streams import tool_stdout

_debug = False
_argv: list[str] = []
_sigterm = False  # the run was stopped by SIGTERM (see _terminated)
_sigint = False  # ... or by Ctrl-C (see _ctrl_c)


def debugging() -> bool:
    """--debug was given (anywhere on the command line): tracebacks instead of one line."""
    return _debug


coercion.plain_option_coercion()


class _Group(TyperGroup):
    """Every failure the user can fix becomes one `Error: ...` line with exit code 2 (or 1)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global _debug, _argv
        argv = list(sys.argv[1:] if args is None else args)
        _debug, _argv = "--debug" in argv, argv
        _room_for_torch(argv)
        _written().clear()  # only this command's files are announced
        try:
            rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except MhaError as e:
            if _debug:
                raise
            _stopped_by_a_signal()  # what a signal broke (an import cut short) is not the news
            _fail(_with_flag(e), e.exit_code)
        except typer.Abort:
            _interrupted() if _sigterm else _fail("aborted", 130)
        except typer.TyperException as e:  # click's usage errors, as typer raises them
            if _debug:
                raise
            if type(e).__name__ == "NoArgsIsHelpError":
                print(e.format_message())
                sys.exit(0)
            ctx = getattr(e, "ctx", None)
            cmd = f" {ctx.info_name}" if ctx is not None and ctx.parent is not None else ""
            _fail(f"{e.format_message()} (see: mha-trace{cmd} --help)", getattr(e, "exit_code", 2))
        except KeyboardInterrupt:
            _interrupted()
        except OSError as e:  # writing the output failed: a full disk, a closed pipe or stdout
            if _debug:
                raise
            _fail(f"cannot write the output: {e.strerror or e}", 1)
        except MemoryError:
            _fail("the run ran out of memory (try smaller sizes, or --device meta for shapes)", 1)
        except Exception as e:  # a bug of ours: still one line on stage; --debug has the rest
            if _debug:
                raise
            _stopped_by_a_signal()
            if "can't allocate memory" in str(e) or "out of memory" in str(e):
                _fail(f"the run ran out of memory: {str(e).strip().splitlines()[-1][:200]}", 1)
            _fail(f"unexpected {type(e).__name__}: {str(e).strip()[:300]} (a bug in mha-trace: "
                  f"--debug shows the traceback)", 1)
        if rv == 130:  # typer turns Ctrl-C (and our SIGTERM) into a silent Exit(130)
            _interrupted()
        if _sigterm or _sigint:  # raised where Python swallows exceptions (a weakref's callback),
            _remove_written()  # and the run went on: stopped all the same, leaving nothing
            _interrupted()
        _announce_files()
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _written() -> list:
    from mha_trace.io.files import WRITTEN

    return WRITTEN


def _remove_written() -> None:
    for path, _ in _written():
        try:
            os.unlink(path)
        except OSError:
            pass
    _written().clear()


def _announce_files() -> None:
    """Every file the command wrote, said on stderr (stdout may be the data)."""
    from mha_trace.io.files import written_line

    if _written():
        sys.stderr.write(written_line(_written()) + "\n")
        _written().clear()


TORCH_FREE = ("configs", "examples", "cost")  # commands that never import torch
TORCH_ADDRESS_SPACE = 1 << 30  # importing torch maps about 700 MiB (measured): 1 GiB with room


def _room_for_torch(argv: list) -> None:
    """A `ulimit -v` too small for torch makes its C++ code abort (no Python error to catch):
    refused first, in one line."""
    import resource

    command = next((a for a in argv if not a.startswith("-")), None)
    if command is None or command in TORCH_FREE or {"-h", "--help"} & set(argv):
        return
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft < TORCH_ADDRESS_SPACE:
        _fail(f"the address-space limit (ulimit -v) is {soft >> 20} MiB, and loading torch needs "
              f"about {TORCH_ADDRESS_SPACE >> 20} MiB (raise it: ulimit -v unlimited)", 1)


def _title() -> str:
    """The command line as typed, for the title of --svg pictures."""
    words, skip = ["mha-trace"], False
    for arg in _argv:
        if skip or arg.split("=")[0] in ("--svg", "--html", "--png"):
            skip = not skip and "=" not in arg
            continue
        words.append(arg)
    return " ".join(words)


def _with_flag(e: MhaError) -> str:
    """The library names the quantity (heads); the command line adds the flag that sets it."""
    if not e.quantity:
        return e.message
    flag = "--" + e.quantity.replace("_", "-")
    if e.message.startswith(f"{e.quantity} "):  # "head 3 is out of range" -> "--head 3 is ..."
        return flag + e.message[len(e.quantity):]
    if e.message.startswith("--") and re.search(rf"{flag}\b(?!-)", e.message):  # it names it already
        return e.message
    return f"{flag}: {e.message}"


def _fail(message: str, code: int):
    try:
        sys.stderr.write(f"Error: {printable(message)}\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):  # no stderr to tell: the exit code still does
        pass
    sys.exit(code)


app = typer.Typer(
    cls=_Group,
    help="See multi-head attention: every tensor shape of a real forward pass, every head's "
         "weights, one token's dot products.\n\nExample: mha-trace shapes --d-model 512 --heads 8",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool):
    if value:
        print(f"mha-trace {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit. Example: mha-trace --version")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show Python tracebacks instead of one-line errors (also after the command). Example: mha-trace --debug shapes")] = False,
):
    """mha-trace: see multi-head attention, one tensor operation at a time."""


def main():
    """Console-script entry point (`python -m mha_trace` too: it names itself mha-trace)."""
    speedups.own_the_process()
    speedups.no_garbage_collection()
    streams.guard_for_command_line()
    signal.signal(signal.SIGTERM, _terminated)
    if signal.getsignal(signal.SIGINT) not in (signal.SIG_IGN, None):  # ignored: `cmd &` in a script
        signal.signal(signal.SIGINT, _ctrl_c)
    sys.meta_path.insert(0, _SignalsHeldWhileTorchLoads())
    if sys.stdout is None or sys.stdout.closed:  # started with stdout closed (`mha-trace ... >&-`)
        _fail("standard output is closed, so there is nowhere to print", 1)
    try:
        os.getcwd()
    except OSError:  # started in a folder since deleted: torch's libraries would abort on import
        _fail("the current folder no longer exists (cd to one that does)", 1)
    if sys.stderr is None:  # started with stderr closed (`2>&-`): nowhere to tell, the codes still do
        sys.stderr = open(os.devnull, "w")
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if stream is not None and not encoding.startswith("utf"):
            stream.reconfigure(errors="replace")  # PYTHONIOENCODING=ascii: ? for what cannot show
    try:
        try:
            app(prog_name="mha-trace")
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM while typer builds the commands
            _interrupted()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    _exit(code)


class _SignalsHeldWhileTorchLoads:
    """The first `import torch` runs with Ctrl-C and SIGTERM held: torch's libraries call back into
    Python while they load, and an interruption raised there aborted the process (exit 134) or
    was swallowed (exit 0). Held, it is raised as soon as torch has loaded. The import leaves out
    what no command on the CPU or a GPU runs (`speedups.meta_kernels_later`)."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Held(spec.loader)
        return spec


class _Held:
    """A module's loader, run with Ctrl-C and SIGTERM held; the module keeps its own loader."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            with speedups.meta_kernels_later(module.__spec__):
                self.loader.exec_module(module)
        finally:
            module.__loader__ = module.__spec__.loader = self.loader
            signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _flush():
    tool_stdout().flush()
    sys.stdout.flush()
    sys.stderr.flush()


def _terminated(signum, frame):
    global _sigterm
    _sigterm = True
    raise Terminated()


def _ctrl_c(signum, frame):
    global _sigint
    _sigint = True
    raise KeyboardInterrupt


def _stopped_by_a_signal() -> None:
    """A Ctrl-C or SIGTERM that came while something was failing because of it is the answer."""
    if _sigterm or _sigint:
        _interrupted()


def _interrupted():
    if _sigterm:
        _fail("terminated (SIGTERM)", 143)
    _fail("interrupted (Ctrl-C)", 130)


def _exit(code: int):
    """Flush and leave. From here on a Ctrl-C or SIGTERM is held, not lost: one that came while
    the last bytes were written still ends the run with its own line and code."""
    try:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        _flush()
    except KeyboardInterrupt:  # it came before the mask: raised here
        _interrupted()
    except Terminated:
        _fail("terminated (SIGTERM)", 143)
    except BrokenPipeError:  # the reader went away (`mha-trace shapes | head`): not an error
        code = code or 0
    except OSError as e:  # a full disk
        try:
            sys.stderr.write(f"Error: cannot write the output: {e.strerror or e}\n")
            sys.stderr.flush()
        except OSError:
            pass
        code = code or 1
    held = signal.sigpending()  # held by the mask; or raised where Python swallows exceptions
    if code == 0 and (signal.SIGTERM in held or _sigterm):  # (a weakref's callback, a __del__)
        _fail("terminated (SIGTERM)", 143)
    if code == 0 and (signal.SIGINT in held or _sigint):
        _fail("interrupted (Ctrl-C)", 130)
    speedups.fast_exit(code)
    sys.exit(code)

