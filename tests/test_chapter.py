"""Every number the chapter publishes for "The cat sat on mat", H = 2, to 4 decimals.

The reference tables below are copied from the chapter (../shared/seeds/, Chapter 2.3); the tool's
numbers come from attention.MultiHeadAttention run on the bundled default config.
"""

import json

import numpy as np
import pytest

from mha_trace.analyses.analysis import analyse
from mha_trace.analyses.walk import walk
from mha_trace.runs.config import load_config
from mha_trace.runs.run import from_config

TOKENS = ["The", "cat", "sat", "on", "mat"]
HEAD1 = [[0.1237, 0.2509, 0.2509, 0.1237, 0.2509],
         [0.3664, 0.0891, 0.3664, 0.0891, 0.0891],
         [0.1811, 0.1811, 0.3673, 0.0893, 0.1811],
         [0.2000, 0.2000, 0.2000, 0.2000, 0.2000],
         [0.1237, 0.2509, 0.2509, 0.1237, 0.2509]]
HEAD2 = [[0.1337, 0.2711, 0.1337, 0.2711, 0.1904],
         [0.2711, 0.1337, 0.1337, 0.2711, 0.1904],
         [0.1337, 0.2711, 0.1337, 0.2711, 0.1904],
         [0.1811, 0.1811, 0.0893, 0.3673, 0.1811],
         [0.2711, 0.1337, 0.1337, 0.2711, 0.1904]]
AVERAGE = [[0.1287, 0.2610, 0.1923, 0.1974, 0.2206],
           [0.3188, 0.1114, 0.2500, 0.1801, 0.1397],
           [0.1574, 0.2261, 0.2505, 0.1802, 0.1858],
           [0.1906, 0.1906, 0.1447, 0.2837, 0.1906],
           [0.1974, 0.1923, 0.1923, 0.1974, 0.2206]]
OUTPUT = [[0.2491, 0.3763, 0.2289, 0.3663],
          [0.4109, 0.1336, 0.2289, 0.3663],
          [0.2717, 0.2717, 0.2289, 0.3663],
          [0.3000, 0.3000, 0.1799, 0.4579],
          [0.2491, 0.3763, 0.2289, 0.3663]]
# the chapter's traces: (dot, scaled, softmax) per key, then the head's output
TRACE = {
    ("The", 1): ([(0.0, 0.0, 0.1237), (1.0, 0.7071, 0.2509), (1.0, 0.7071, 0.2509),
                  (0.0, 0.0, 0.1237), (1.0, 0.7071, 0.2509)], [0.2491, 0.3763]),
    ("The", 2): ([(0.0, 0.0, 0.1337), (1.0, 0.7071, 0.2711), (0.0, 0.0, 0.1337),
                  (1.0, 0.7071, 0.2711), (0.5, 0.3536, 0.1904)], [0.2289, 0.3663]),
    ("cat", 1): ([(2.0, 1.4142, 0.3664), (0.0, 0.0, 0.0891), (2.0, 1.4142, 0.3664),
                  (0.0, 0.0, 0.0891), (0.0, 0.0, 0.0891)], [0.4109, 0.1336]),
    ("cat", 2): ([(1.0, 0.7071, 0.2711), (0.0, 0.0, 0.1337), (0.0, 0.0, 0.1337),
                  (1.0, 0.7071, 0.2711), (0.5, 0.3536, 0.1904)], [0.2289, 0.3663]),
}


@pytest.fixture(scope="module")
def view():
    return analyse(from_config(load_config()))


def r4(a):
    return np.round(np.asarray(a, dtype=float), 4)


def test_per_head_weights(view):
    assert view.tokens == tuple(TOKENS)
    np.testing.assert_array_equal(r4(view.weights[0]), HEAD1)
    np.testing.assert_array_equal(r4(view.weights[1]), HEAD2)


def test_average_and_output(view):
    np.testing.assert_array_equal(r4(view.weights.mean(0)), AVERAGE)
    np.testing.assert_array_equal(r4(view.output), OUTPUT)
    np.testing.assert_array_equal(view.output, view.concat)  # W_O is the identity
    assert view.wo_identity


@pytest.mark.parametrize("token,head", sorted(TRACE))
def test_token_traces(view, token, head):
    w = walk(view, TOKENS.index(token))
    hw = w.heads[head - 1]
    keys, output = TRACE[(token, head)]
    got = [(t.dot, t.scaled, t.weight) for t in hw.terms]
    np.testing.assert_array_equal(r4(got), keys)
    np.testing.assert_array_equal(r4(hw.output), output)
    assert round(w.sqrt_dk, 4) == 1.4142


def test_the_concatenation_from_the_chapter(view):
    np.testing.assert_array_equal(r4(walk(view, 0).concat), [0.2491, 0.3763, 0.2289, 0.3663])


def _r(x):
    """The chapter prints 4 decimals; JSON keeps every digit."""
    return round(x, 4) if isinstance(x, float) else [_r(v) for v in x]


def test_cli_json_carries_the_same_numbers(cli):
    heads = json.loads(cli("heads", "--format", "json").stdout)
    assert [_r(h["weights"]) for h in heads["heads"]] == [HEAD1, HEAD2]
    assert _r(heads["average"]) == AVERAGE and _r(heads["output"]) == OUTPUT
    explain = json.loads(cli("explain", "--token", "cat", "--format", "json").stdout)
    for h in explain["heads"]:
        keys, output = TRACE[("cat", h["head"])]
        assert [_r([k["dot"], k["scaled"], k["weight"]]) for k in h["keys"]] == [list(k) for k in keys]
        assert _r(h["output"]) == output
    assert _r(explain["sqrt_d_k"]) == 1.4142


def test_json_keeps_full_precision(cli):
    for args in (("heads",), ("heads", "--config", "chicken-road"), ("heads", "--mask", "causal")):
        data = json.loads(cli(*args, "--format", "json", "--decimals", "2").stdout)
        for head in data["heads"]:
            assert all(abs(sum(row) - 1) < 1e-12 for row in head["weights"])
