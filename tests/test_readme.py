"""The README shows real output: each `$ mha-trace ...` block is what the command prints now."""

import importlib.util
from pathlib import Path

import pytest

spec = importlib.util.spec_from_file_location("readme", Path(__file__).parent.parent / "docs" / "readme.py")
readme = importlib.util.module_from_spec(spec)
spec.loader.exec_module(readme)
BLOCKS = [(cmd, body) for _, cmd, body in readme.blocks(readme.README.read_text())]


def test_readme_has_examples_of_every_command():
    commands = {cmd.split()[1] for cmd, _ in BLOCKS}
    assert commands >= {"shapes", "heads", "explain", "compare", "ablate", "configs", "cost", "verify"}


def test_readme_starts_with_the_two_setup_commands():
    lines = readme.README.read_text().splitlines()
    assert lines[3].endswith("&& mha-trace shapes")
    run = Path(__file__).parent.parent / ".ci" / "run"
    assert lines[4] in run.read_text().splitlines()  # CI runs exactly the README's test command


@pytest.mark.parametrize("command,body", BLOCKS, ids=[c for c, _ in BLOCKS])
def test_readme_block_is_real_output(command, body):
    assert readme.output(command) == body, "python docs/readme.py refreshes the README"
