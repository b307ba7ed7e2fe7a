"""Rank statistics the analyses share. Plain NumPy."""

import numpy as np


def spearman(a, b) -> float | None:
    """Spearman's ρ of two arrays of equal size, flattened: the correlation of their ranks (by
    argsort; ties, vanishingly rare in these floats, ranked by position). None where it is
    undefined: fewer than two values have no ranking to compare."""
    if np.size(a) < 2:
        return None
    ranks = [np.argsort(np.argsort(np.ravel(x), kind="stable"), kind="stable") for x in (a, b)]
    return float(np.corrcoef(ranks[0], ranks[1])[0, 1])
