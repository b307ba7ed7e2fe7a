"""Snapshots that compare what a screen means, not the bytes a library or a CPU happened to draw.

- Text: every character that is not part of a number must be the same, spaces included (the layout).
- Numbers: to the digits that are not float noise. A number written with 3 or more decimals may
  differ by one unit in its last digit (a float32 sum can round either way on another CPU); a number in
  scientific notation below 1e-5 is a floating-point residue (a max |diff| of 1.80e-07 on one CPU is
  1.83e-07 on another) and matches any other such residue.
- The explorer: its text and which cells share a background colour (the cursor row, the lit
  heat-map cells), never the colours themselves (Pygments and Textual's themes choose those).
"""

import re

NUMBER = re.compile(r"[-+−]?\d+(?:\.(\d+))?(?:e([-+]\d+))?")
RESIDUE = 1e-5  # below this, a number written in scientific notation is float noise


def _value(token: str) -> float:
    return float(token.replace("−", "-"))


def _same_number(a: re.Match, b: re.Match) -> bool:
    if a.group(0) == b.group(0):
        return True
    if (a.group(2) or b.group(2)) is not None:  # scientific notation: residues match each other
        return a.group(2) is not None and b.group(2) is not None and \
            abs(_value(a.group(0))) < RESIDUE and abs(_value(b.group(0))) < RESIDUE
    decimals = len(a.group(1) or "")
    if decimals < 3 or decimals != len(b.group(1) or "") or len(a.group(0)) != len(b.group(0)):
        return False  # counts, sizes and short figures are exact
    return abs(_value(a.group(0)) - _value(b.group(0))) <= 1.01 * 10 ** -decimals


def differences(actual: str, expected: str) -> list[str]:
    """The lines where `actual` means something else than `expected` (empty: the same)."""
    a_lines, e_lines = actual.splitlines(), expected.splitlines()
    found = [f"{len(a_lines)} lines, expected {len(e_lines)}"] if len(a_lines) != len(e_lines) else []
    for n, (a, e) in enumerate(zip(a_lines, e_lines), 1):
        a_nums, e_nums = list(NUMBER.finditer(a)), list(NUMBER.finditer(e))
        same = NUMBER.sub("#", a) == NUMBER.sub("#", e) and len(a_nums) == len(e_nums) and all(
            x.start() == y.start() and _same_number(x, y) for x, y in zip(a_nums, e_nums))
        if not same:
            found.append(f"line {n}:\n  got      {a!r}\n  expected {e!r}")
    return found


def screen(app) -> str:
    """A Textual app's screen as text, then one symbol per cell for its background: cells with
    the same symbol have the same colour, whatever the colour is."""
    import io

    from rich.console import Console
    from rich.segment import Segment

    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True))
    symbols, text, shade = {}, [""], [""]
    alphabet = ".abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    for line in Segment.split_lines(console._record_buffer):
        for seg in line:
            if seg.control:
                continue
            style = seg.style
            bg = style.bgcolor.get_truecolor() if style and style.bgcolor else None
            if style and style.reverse:
                bg = ("reverse", bg)
            key = symbols.setdefault(bg, alphabet[len(symbols) % len(alphabet)])
            text[-1] += seg.text
            shade[-1] += key * len(seg.text)
        text.append("")
        shade.append("")
    return "\n".join([*(t.rstrip() for t in text[:height]), "", "backgrounds:",
                      *shade[:height]]) + "\n"
