"""Which options go together, declared as data beside a command's options and judged in one place,
before torch, with one wording for the command line and the Python API (no torch here).

>>> rules = (needs("block_q", "io", "counts main-memory traffic"),)
>>> judge({"block_q": 2, "io": False}, rules)
Traceback (most recent call last):
mha_trace.errors.MhaError: --block-q counts main-memory traffic: add --io
"""

from dataclasses import dataclass

from mha_trace.errors import MhaError


@dataclass(frozen=True)
class Rule:
    """`needs`: the first option only with the second; `together`: both or neither; `apart`: the
    first never with any of the others; `within`: while the first holds (a source, a mode), none
    of the others, and `says` is the whole refusal. `says` is why, in the command line's words."""

    kind: str
    names: tuple
    says: str


def needs(option: str, on: str, says: str) -> Rule:
    return Rule("needs", (option, on), says)


def together(a: str, b: str, says: str) -> Rule:
    return Rule("together", (a, b), says)


def apart(option: str, others: tuple, says: str) -> Rule:
    return Rule("apart", (option, *others), says)


def within(mode: str, others: tuple, says: str) -> Rule:
    return Rule("within", (mode, *others), says)


def flag(name: str) -> str:
    """by_head -> --by-head; impl=tiled (an option's value, given as a switch) -> --impl tiled."""
    return "--" + name.replace("_", "-").replace("=", " ")


def given(value) -> bool:
    """An option the user set: not None, and not a switch left off."""
    return value is not None and value is not False


def judge(values: dict, rules) -> None:
    """The first rule the values break, as one MhaError naming the option to change."""
    for rule in rules:
        first, *rest = rule.names
        if rule.kind == "needs" and given(values[first]) and not given(values[rest[0]]):
            raise MhaError(f"{flag(first)} {rule.says}: add {flag(rest[0])}", quantity=_option(first))
        if rule.kind == "together" and given(values[first]) != given(values[rest[0]]):
            raise MhaError(f"{flag(first)} and {flag(rest[0])} go together ({rule.says})",
                           quantity=_option(rest[0] if given(values[first]) else first))
        clash = [flag(name) for name in rest if given(values[name])]
        if rule.kind == "within" and given(values[first]) and clash:
            raise MhaError(rule.says, quantity=_option(first))
        if rule.kind == "apart" and given(values[first]) and clash:
            raise MhaError(f"{flag(first)} does not go with {', '.join(clash)} ({rule.says})",
                           quantity=_option(first))


def _option(name: str) -> str:
    return name.partition("=")[0]
