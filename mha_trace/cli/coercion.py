"""typer's option coercion without pydantic: a start-up speed-up (`MHA_TRACE_NO_SPEEDUPS=1`
turns it off, as every other one in `mha_trace.speedups`)."""

import types

from mha_trace import speedups


def plain_option_coercion() -> None:
    """Coerce plain options (int, float, str, bool, str enums) without pydantic.

    typer 0.29 coerces every option through a pydantic TypeAdapter: importing pydantic and
    building the adapters costs about 0.1 s of every run. Our options are all plain types, which
    need no schema; anything else (and any typer without these internals) keeps typer's own path.
    """
    if not speedups.ENABLED:
        return
    import typer
    from dataclasses import dataclass

    try:
        from typer import _coercion, core
        base, get = _coercion.RuntimeParam, core._TyperParameter.get_runtime_param
    except (ImportError, AttributeError):
        return

    @dataclass(frozen=True)
    class Plain(base):
        def _coerce_value(self, value, param, ctx):
            return _coerced(self.annotation, self.parameter_info, value,
                            lambda message: typer.BadParameter(message, ctx, param))

    def get_runtime_param(self):
        descriptor = self.type_descriptor
        kind = _plain(descriptor.annotation)
        if self._runtime_param is None and kind is not None and descriptor.file_annotation is None:
            self._runtime_param = Plain(parameter_info=descriptor.parameter_info, annotation=kind)
        return get(self)

    core._TyperParameter.get_runtime_param = get_runtime_param


def _plain(annotation):
    """int, float, str, bool or a str enum (optional or not), else None: typer's own path."""
    import typing
    from enum import Enum

    args = typing.get_args(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType) and len(args) == 2 \
            and type(None) in args:
        annotation = args[0] if args[1] is type(None) else args[1]
    if annotation in (int, float, str, bool) or (isinstance(annotation, type) and issubclass(annotation, Enum)):
        return annotation
    return None


def _coerced(kind, info, value, bad):
    """`value` as `kind`, within the option's min and max; `bad(message)` is the error raised."""
    if isinstance(value, kind):
        result = value
    elif kind is int:
        try:
            result = int(str(value).strip())
        except ValueError:
            raise bad(f"{_short(value)} is not a whole number") from None
    elif kind is float:
        try:
            result = float(str(value).strip())
        except ValueError:
            raise bad(f"{_short(value)} is not a number") from None
    elif kind not in (str, bool):  # a str enum
        try:
            result = kind(value)
        except ValueError:
            raise bad(f"{_short(value)} is not one of {', '.join(repr(m.value) for m in kind)}") from None
    else:
        result = kind(value)
    if kind in (int, float) and info.min is not None and result < info.min:
        raise bad(f"{_short(result)} is less than the minimum, {info.min}")
    if kind in (int, float) and info.max is not None and result > info.max:
        raise bad(f"{_short(result)} is more than the maximum, {info.max}")
    return result


def _short(value) -> str:
    """A value as an error shows it: a 400-digit number or a pasted page cut to one line."""
    text = repr(value) if isinstance(value, str) else str(value) if not isinstance(value, int) \
        or value.bit_length() < 128 else f"a {len(str(abs(value)))}-digit number"
    return text if len(text) <= 40 else text[:38] + "…" + text[-1]
