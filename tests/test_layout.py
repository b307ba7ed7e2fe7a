"""Projector widths: at 80, 100 and 120 columns every traced step is one line, its code cut in the
middle only (the start and the end are the run's own code), and no line is wider than asked."""

import json
import re

import pytest

IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
RUNS = [("shapes",), ("shapes", "--kv-heads", "2"), ("shapes", "--mask", "causal", "--pad", "2"),
        ("shapes", "--impl", "sdpa"), ("shapes", "--rope", "--seq", "4"),
        ("shapes", "--impl", "tiled", "--mask", "causal", "--seq", "7", "--block-q", "3"),
        ("shapes", "--decode", "2", "--seq", "3", "--kv-heads", "2"),
        ("shapes", "--module", "example:committee", "--d-model", "64", "--heads", "4")]


@pytest.mark.parametrize("width", [80, 100, 120])
@pytest.mark.parametrize("args", RUNS, ids=" ".join)
def test_every_step_is_one_line_with_its_code_elided_in_the_middle(cli, args, width):
    text = cli(*args, "--width", str(width)).stdout
    steps = json.loads(cli(*args, "--format", "json").stdout)["steps"]
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    rows = {int(line.split()[0]): line for line in lines if re.match(r"\s*\d+\s+(\d+|in)\s", line)}
    shown = [s for s in steps if s["step"] in rows]
    assert len(shown) >= len(steps) // 3  # folded loops show their block once
    header = next(line for line in lines if " code " in line and " op " in line)
    start, end = header.index("code"), header.index(" op ") + 1
    for step in shown:
        line = rows[step["step"]]
        assert f" {step['op']} " in line and str(step["shape"]).replace("'", "") in line
        code, cell = " ".join(step["text"].split()), line[start:end].strip()
        if code.startswith("… "):  # the rest of a line whose start is the row above
            code, cell = code[2:], cell[2:]
        head, cut, tail = cell.partition("…")
        assert cell == code or cut and code.startswith(head) and code.endswith(tail), (code, line)
        assert not cut or len(head) >= len(tail)  # the call's start stays readable
        if "stride" in header:
            assert "(" + ",".join(map(str, step["stride"])) + ")" in line


@pytest.mark.parametrize("width", [80, 100, 120])
def test_verify_never_cuts_a_reference_name(cli, width):
    text = cli("verify", "--kv-heads", "2", "--width", str(width)).stdout
    assert "F.scaled_dot_product_attention" in text and "nn.MultiheadAttention" in text
    assert max(len(line) for line in text.splitlines()) <= width


@pytest.mark.parametrize("args", [(), ("--kv-heads", "2"), ("--impl", "sdpa"), ("--rope", "--seq", "6"),
                                  ("--batch", "3", "--seq", "3", "--heads", "3", "--d-model", "9")])
@pytest.mark.slow
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
