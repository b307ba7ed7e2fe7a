"""What every medium shows alike: sizes in bytes (binary, one decimal), shapes, a RoPE plane's
turn and a token's leading space.
"""

import math

WORD_START = "␣"  # a byte-level token's leading space (SentencePiece writes ▁; a slide font draws
# that as an underscore), the same in the terminal, the page, the slides and JSON


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable


def shape_text(t: tuple) -> str:
    """(2, 10, 512) -> '[2, 10, 512]', as torch prints a size."""
    return "[" + ", ".join(map(str, t)) + "]"


def turn_text(theta: float) -> str:
    """Tokens for one full turn of a plane: 6.28, 62.8, 1,387."""
    turn = 2 * math.pi / theta
    return f"{turn:.3g}" if turn < 1000 else f"{turn:,.0f}"


def shared(x: float, signed: bool = False) -> str:
    """A share as every output writes it: two decimals, no -0.00, and "—" where it is undefined."""
    if x != x:  # NaN: no gap to take a share of
        return "—"
    shown = f"{x:+.2f}" if signed else f"{x:.2f}"
    return ("+" if signed else "") + "0.00" if float(shown) == 0 else shown
