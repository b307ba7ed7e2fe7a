"""`heads`, `explain` and `configs` as rendered text (golden files) and JSON."""

import json
import math
import os
import subprocess
import sys

import pytest

GOLDEN_RUNS = {
    "screens/heads-100x30.txt": ("heads",),
    "heads_permuted_wo.txt": ("heads", "--config", "permuted-wo"),
    "heads_causal_one_head.txt": ("heads", "--config", "animal-street", "--head", "2"),
    "screens/explain-token-cat-100x30.txt": ("explain", "--token", "cat"),
    "explain_the.txt": ("explain", "--token", "The"),
    "explain_chicken_it.txt": ("explain", "--config", "chicken-road", "--token", "it", "--head", "1"),
    "explain_cat_effect.txt": ("explain", "--token", "cat", "--effect"),
    "explain_chicken_why.txt": ("explain", "--config", "chicken-road", "--token", "it", "--head", "3", "--why"),
    "heads_chicken_effect.txt": ("heads", "--config", "chicken-road", "--head", "3", "--effect"),
    "screens/configs-100x30.txt": ("configs",),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_RUNS))
@pytest.mark.slow
def test_rendered_output_matches_golden(golden_run, name):
    golden_run(name, GOLDEN_RUNS[name])


def test_markdown_tables(cli):
    out = cli("heads", "--format", "markdown").stdout
    assert "| q \\ k | The | cat | sat | on | mat |" in out
    assert "| cat | 0.3664* | 0.0891 | 0.3664* | 0.0891 | 0.0891 |" in out


def test_decimals_option(cli):
    e = math.exp(2 / math.sqrt(2))  # cat -> The in head 1: scores 2, 0, 2, 0, 0 over √2
    expected = round(e / (2 * e + 3), 6)
    data = json.loads(cli("heads", "--decimals", "6", "--format", "json").stdout)
    assert data["heads"][0]["weights"][1][0] == pytest.approx(e / (2 * e + 3), abs=1e-15)
    assert f"{expected:.6f}" in cli("heads", "--decimals", "6").stdout


def test_masked_cells_are_marked_not_zero(cli):
    out = cli("heads", "--mask", "causal", "--head", "1").stdout
    the_row = next(line for line in out.splitlines() if line.startswith("The  "))
    assert the_row.split() == ["The", "1.0000*", "·", "·", "·", "·"]
    data = json.loads(cli("heads", "--mask", "causal", "--format", "json").stdout)
    assert data["mask"][0] == [True, False, False, False, False]


def test_configs_json_lists_every_bundled_config(cli):
    data = json.loads(cli("configs", "--format", "json").stdout)
    names = [c["name"] for c in data["configs"]]
    assert names == ["animal-street", "cat-sat-on-mat", "chicken-road", "permuted-wo"]
    chicken = data["configs"][names.index("chicken-road")]
    assert chicken["heads"] == 8 and chicken["tokens"][-1] == "wide."


@pytest.mark.slow
def test_installed_package_finds_bundled_configs_from_another_directory(tmp_path):
    """The installed wheel (not this checkout) carries configs/ and examples/: run it from an
    empty directory, the listings as commands and the runs that read them in one process."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = lambda *a: subprocess.run([sys.executable, *a], cwd=tmp_path, capture_output=True,
                                    text=True, env=env, timeout=120)
    listing = run("-m", "mha_trace", "configs")
    assert listing.returncode == 0 and "chicken-road" in listing.stdout
    listing = run("-m", "mha_trace", "examples")  # the examples ship inside the package too
    assert listing.returncode == 0 and "example:l04" in listing.stdout
    commands = [["heads", "--config", "chicken-road", "--head", "1"], ["explain", "--token", "cat"],
                ["shapes", "--module", "example:l04", "--d-model", "64", "--heads", "4"]]
    code = ("import json; from typer.testing import CliRunner; from mha_trace.cli import app; "
            f"print(json.dumps([[r.exit_code, r.output] for r in "
            f"(CliRunner().invoke(app, a) for a in {commands!r})]))")
    found = run("-c", code)
    assert found.returncode == 0, found.stderr
    results = json.loads(found.stdout)
    assert [code for code, _ in results] == [0, 0, 0], results
    assert "The chicken didn't cross the road" in results[0][1]
