"""One masks module: every kind against np.tril / np.triu written out by hand."""

import numpy as np
import pytest

from mha_trace.core.masks import allowed
from mha_trace.runs.run import make_mask


@pytest.mark.parametrize("T", [1, 4, 7])
def test_each_kind_against_numpy_by_hand(T):
    ones = np.ones((T, T), bool)
    assert np.array_equal(allowed(T), ones)
    assert np.array_equal(allowed(T, "causal"), np.tril(ones))
    for W in (1, 2, T):
        assert np.array_equal(allowed(T, window=W), np.tril(ones) & np.triu(ones, -(W - 1)))
    for pad in range(T):
        by_hand = ones.copy()
        by_hand[:, T - pad:] = False
        assert np.array_equal(allowed(T, pad=pad), by_hand)
        assert np.array_equal(allowed(T, "causal", pad=pad), by_hand & np.tril(ones))


def test_the_runs_mask_is_the_same_and_padding_costs_one_row():
    assert make_mask(5) is None
    np.testing.assert_array_equal(make_mask(5, "causal", 1).numpy(), allowed(5, "causal", 1))
    padded = make_mask(6, "none", 2)
    np.testing.assert_array_equal(padded.numpy(), allowed(6, pad=2))
    assert padded.untyped_storage().nbytes() == 6  # one row of T, expanded: no T·T copy
