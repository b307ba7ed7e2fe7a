"""Shared test helpers: golden files and a CLI runner."""

from pathlib import Path

import pytest
from typer.testing import CliRunner

GOLDEN = Path(__file__).parent / "golden"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/* from the current output instead of comparing")


@pytest.fixture
def golden(request):
    """golden("name.txt", text): compare with tests/golden/name.txt (or rewrite it when asked)."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str):
        path = GOLDEN / name
        if update:
            path.write_text(text)
            return
        assert path.exists(), f"missing golden file {path}; run pytest --update-golden once"
        assert text == path.read_text(), f"output differs from {path} (pytest --update-golden)"

    return check


@pytest.fixture
def cli(monkeypatch):
    """cli("shapes", "--heads", "4") -> click Result, as a piped, colourless run."""
    from mha_trace.cli import app

    monkeypatch.delenv("COLUMNS", raising=False)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False)

    return invoke


@pytest.fixture
def golden_run(cli, golden):
    """golden_run("name.txt", args): run the CLI, expect success, compare stdout with the golden file."""

    def check(name: str, args):
        result = cli(*args)
        assert result.exit_code == 0, result.stderr
        golden(name, result.stdout)

    return check
