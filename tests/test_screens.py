"""Every command's default view on the screens a lecturer uses: 80×24, 100×30 and 120×32. Each is
kept as a golden screen, no line is wider than the screen, and the number of lines is held to a
budget (how many screens it takes is part of the layout: a change that makes it longer fails here).
"""

import pytest

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

WIDTHS = {80: 24, 100: 30, 120: 32}  # columns: rows of the screen
# command -> lines at 80, 100 and 120 columns
BUDGET = {
    ("shapes",): (35, 32, 31),
    ("heads",): (41, 31, 22),
    ("explain", "--token", "cat"): (30, 29, 29),
    ("compare",): (72, 70, 59),
    ("ablate", "--head", "2"): (18, 13, 12),
    ("configs",): (29, 17, 14),
    ("cost",): (38, 37, 36),
    ("verify",): (13, 12, 12),
    ("examples",): (33, 23, 19),
    ("heads", "--model", "minilm"): (57, 56, 32),
    ("survey", "--model", "minilm"): (52, 46, 46),
}


@pytest.mark.parametrize("width", sorted(WIDTHS))
@pytest.mark.parametrize("args", list(BUDGET), ids=" ".join)
def test_default_views_fit_the_screen(cli, golden, args, width):
    result = cli(*args, "--width", str(width))
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(len(line) for line in lines) <= width
    budget = BUDGET[args][sorted(WIDTHS).index(width)]
    assert len(lines) <= budget, f"{len(lines)} lines, over the budget of {budget}"
    golden(f"screens/{'-'.join(a.strip('-') for a in args)}-{width}x{WIDTHS[width]}.txt", result.stdout)


def test_the_model_overview_fits_one_120_by_32_screen(cli):
    lines = cli("heads", "--model", "minilm", "--width", "120").stdout.splitlines()
    assert len(lines) <= WIDTHS[120]
