"""Projector widths: at 80, 100 and 120 columns no identifier of the run's own code is ever split
across lines, and no line is wider than asked."""

import json
import re

import pytest

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
RUNS = [("shapes",), ("shapes", "--kv-heads", "2"), ("shapes", "--mask", "causal", "--pad", "2"),
        ("shapes", "--impl", "sdpa"), ("shapes", "--rope", "--seq", "4"),
        ("shapes", "--decode", "2", "--seq", "3", "--kv-heads", "2"),
        ("shapes", "--module", "example:committee", "--d-model", "64", "--heads", "4")]


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("args", RUNS, ids=" ".join)
def test_no_identifier_is_split(cli, args, width):
    text = cli(*args, "--width", str(width)).stdout
    steps = json.loads(cli(*args, "--format", "json").stdout)["steps"]
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    words = {w for line in lines for w in IDENTIFIER.findall(line)}
    for step in steps:
        for name in IDENTIFIER.findall(step["text"]) + [step["op"]]:
            assert name in words, (name, step["text"])


@pytest.mark.parametrize("width", [80, 100, 120])
def test_verify_never_cuts_a_reference_name(cli, width):
    text = cli("verify", "--kv-heads", "2", "--width", str(width)).stdout
    assert "F.scaled_dot_product_attention" in text and "nn.MultiheadAttention" in text
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("args", [(), ("--kv-heads", "2"), ("--impl", "sdpa"), ("--rope", "--seq", "6"),
                                  ("--batch", "3", "--seq", "3", "--heads", "3", "--d-model", "9")])
def test_compact_layout_has_the_lecture_rows_with_symbols_from_the_run(cli, args):
    data = json.loads(cli("shapes", "--compact", *args, "--format", "json").stdout)
    rows = {r["row"]: r["symbols"] for r in data["compact"]}
    assert list(rows) == ["input", "W_q", "view", "transpose", "attention", "transpose back",
                          "contiguous + view", "W_o"]
    assert rows["view"] == "(B, T, H, d_k)" and rows["transpose"] == "(B, H, T, d_k)"
    assert rows["attention"] == "(B, H, T, d_k)" and rows["W_o"] == "(B, T, d_model)"
    for width in (80, 100):
        text = cli("shapes", "--compact", *args, "--width", str(width)).stdout
        assert max(len(line) for line in text.splitlines()) <= width
        assert all(row in text for row in ("transpose back", "contiguous + view", "(B, H, T, d_k)"))
