"""The Typer app, its error handling and the console-script entry point."""

import gc
import os
import sys
from typing import Annotated

import typer
from typer.core import TyperGroup

from mha_trace import __version__
from mha_trace.errors import MhaError, printable

_debug = False
_argv: list[str] = []


def debugging() -> bool:
    """--debug was given (anywhere on the command line): tracebacks instead of one line."""
    return _debug


def _plain_coercion() -> None:
    """Coerce plain options (int, str, bool, str enums) without pydantic.

    typer 0.29 coerces every option through a pydantic TypeAdapter: importing pydantic and
    building the adapters costs about 0.1 s of every run. Our options are all plain types, which
    need no schema; anything else (and any typer without these internals) keeps typer's own path.
    """
    import types
    import typing
    from dataclasses import dataclass
    from enum import Enum

    try:
        from typer import _coercion, core
        base, get = _coercion.RuntimeParam, core._TyperParameter.get_runtime_param
    except (ImportError, AttributeError):
        return

    def plain(annotation):
        args = typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 2 \
                and type(None) in args:
            annotation = args[0] if args[1] is type(None) else args[1]
        if annotation in (int, str, bool) or (isinstance(annotation, type) and issubclass(annotation, Enum)):
            return annotation
        return None

    @dataclass(frozen=True)
    class Plain(base):
        def _coerce_value(self, value, param, ctx):
            kind, info = self.annotation, self.parameter_info
            if isinstance(value, kind):
                result = value
            elif kind is int:
                try:
                    result = int(str(value).strip())
                except ValueError:
                    raise typer.BadParameter(f"{value!r} is not a whole number", ctx, param) from None
            elif issubclass(kind, Enum):
                try:
                    result = kind(value)
                except ValueError:
                    valid = ", ".join(repr(m.value) for m in kind)
                    raise typer.BadParameter(f"{value!r} is not one of {valid}", ctx, param) from None
            else:
                result = kind(value)
            if kind is int and info.min is not None and result < info.min:
                raise typer.BadParameter(f"{result} is less than the minimum, {info.min}", ctx, param)
            if kind is int and info.max is not None and result > info.max:
                raise typer.BadParameter(f"{result} is more than the maximum, {info.max}", ctx, param)
            return result

    def get_runtime_param(self):
        descriptor = self.type_descriptor
        kind = plain(descriptor.annotation)
        if self._runtime_param is None and kind is not None and descriptor.file_annotation is None:
            self._runtime_param = Plain(parameter_info=descriptor.parameter_info, annotation=kind)
        return get(self)

    core._TyperParameter.get_runtime_param = get_runtime_param


_plain_coercion()


class _Group(TyperGroup):
    """Every failure the user can fix becomes one `Error: ...` line with exit code 2 (or 1)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global _debug, _argv
        argv = list(sys.argv[1:] if args is None else args)
        _debug, _argv = "--debug" in argv, argv
        try:
            rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except MhaError as e:
            if _debug:
                raise
            _fail(_with_flag(e), e.exit_code)
        except typer.Abort:
            _fail("aborted", 130)
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
            _fail("interrupted (Ctrl-C)", 130)
        except OSError as e:  # writing the output failed: a full disk, a closed pipe or stdout
            if _debug:
                raise
            _fail(f"cannot write the output: {e.strerror or e}", 1)
        except MemoryError:
            _fail("the run ran out of memory (try smaller sizes, or --device meta for shapes)", 1)
        except Exception as e:  # a bug of ours: still one line on stage; --debug has the rest
            if _debug:
                raise
            if "can't allocate memory" in str(e) or "out of memory" in str(e):
                _fail(f"the run ran out of memory: {str(e).strip().splitlines()[-1][:200]}", 1)
            _fail(f"unexpected {type(e).__name__}: {str(e).strip()[:300]} (a bug in mha-trace: "
                  f"--debug shows the traceback)", 1)
        if rv == 130:  # typer turns Ctrl-C into a silent Exit(130)
            _fail("interrupted (Ctrl-C)", 130)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


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
    """Console-script entry point (`python -m mha_trace` too: it names itself mha-trace).

    The garbage collector is off for this one short command: importing torch creates hundreds
    of thousands of objects and no cycles worth collecting, and the collections cost about 0.15 s.
    """
    gc.disable()
    if sys.stdout is None or sys.stdout.closed:  # started with stdout closed (`mha-trace ... >&-`)
        _fail("standard output is closed, so there is nowhere to print", 1)
    for stream in (sys.stdout, sys.stderr):
        encoding = (getattr(stream, "encoding", None) or "").lower().replace("-", "")
        if stream is not None and not encoding.startswith("utf"):
            stream.reconfigure(errors="replace")  # PYTHONIOENCODING=ascii: ? for what cannot show
    try:
        app(prog_name="mha-trace")
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    _exit(code)


def _exit(code: int):
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away (`mha-trace shapes | head`): not an error
        code = code or 0
    except OSError as e:  # a full disk
        try:
            sys.stderr.write(f"Error: cannot write the output: {e.strerror or e}\n")
            sys.stderr.flush()
        except OSError:
            pass
        code = code or 1
    if "torch" in sys.modules:
        # torch's interpreter teardown alone costs about 0.3 s and nothing of ours needs it:
        # everything is written and flushed, so leave at once.
        os._exit(code)
    sys.exit(code)

