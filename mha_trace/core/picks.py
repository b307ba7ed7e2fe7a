"""Which head and which token a flag picks, checked against the heads and tokens there are.
No torch, no numpy: a config knows both before its run is built, so a wrong pick on the
command line is refused before torch is imported (the run checks them again as it shows them).
"""

import re

from mha_trace.errors import MhaError, printable
from mha_trace.io.units import WORD_START


def head_number(head: str | None) -> int | None:
    """--head for a config or a user's module: one number (a model's L.H goes with --model)."""
    if head is None:
        return None
    if re.fullmatch(r"[0-9]{1,9}", head) is None:
        hint = " (LAYER.HEAD goes with --model)" if "." in head else ""
        raise MhaError(f"head '{printable(head)}' is not a whole number{hint}", quantity="head")
    return int(head)


def check_picks(config, heads: list, token: str | None = None, position: int | None = None) -> None:
    """A config's picks (`heads`, from 1, None for none; the token) checked against its heads
    and tokens, before its run is built (`config` None: nothing to check yet)."""
    if config is not None:
        for head in (h for h in heads if h is not None):
            check_head(head, config.heads)
        find_position(config.tokens, token, position)


def check_head(head, heads: int, what: str = "this config has") -> int:
    """`head` (from 1) if it is one of `heads`; `what` names whose heads they are."""
    if not (isinstance(head, int) and 1 <= head <= heads):
        raise MhaError(f"head {head!r} is out of range ({what} heads 1 to {heads})",
                       quantity="head")
    return head


def find_position(tokens, token: str | None, position: int | None) -> int:
    """The index of the token to explain; a repeated token needs --position."""
    if position is not None:
        if not 0 <= position < len(tokens):
            raise MhaError(f"position {position} is out of range (positions 0 to "
                           f"{len(tokens) - 1}: {', '.join(tokens)})", quantity="position")
        if token is not None and tokens[position] != token:
            raise MhaError(f"position {position} is '{tokens[position]}', not '{token}'",
                           quantity="position")
        return position
    if token is None:
        return 0
    found = [i for i, t in enumerate(tokens) if t == token]
    if not found:  # a byte-level token shows its leading space as ␣: "it" finds "␣it"
        found = [i for i, t in enumerate(tokens) if t.removeprefix(WORD_START) == token]
    if not found:
        raise MhaError(f"token '{token}' is not in the sentence (tokens: {', '.join(tokens)})",
                       quantity="token")
    if len(found) > 1:
        raise MhaError(f"token '{token}' appears at positions {', '.join(map(str, found))} "
                       f"(pick one with --position)", quantity="token")
    return found[0]
