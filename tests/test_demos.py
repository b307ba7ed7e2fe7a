"""The lecture demos run as they are, and print what their golden files hold."""

import os
import subprocess
from pathlib import Path

import pytest

DEMOS = sorted((Path(__file__).parent.parent / "demos").glob("*.sh"))


def test_there_are_demos_for_the_lecture():
    assert len(DEMOS) >= 4


@pytest.mark.parametrize("demo", DEMOS, ids=lambda p: p.name)
def test_demo_output_matches_golden(demo, golden):
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    p = subprocess.run(["bash", str(demo)], capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    golden(f"demos/{demo.stem}.txt", p.stdout)
