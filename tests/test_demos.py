"""The lecture demos run as they are, and print what their golden files hold.

Each demo is a bash script run by bash; its `mha-trace` commands run in this process, as the
README's blocks do (a shim on PATH hands each command line here over a socket and prints what
came back): the shell's pipes, `set -e` and the scripts' own lines are real, without a second
interpreter importing torch for every command. The real process is tested in test_cli_process.
"""

import json
import os
import socket
import subprocess
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

DEMOS = sorted((Path(__file__).parent.parent / "demos").glob("*.sh"))

SHIM = """#!{python} -S
import json, os, socket, sys

s = socket.socket(socket.AF_UNIX)
s.connect({address!r})
s.sendall(json.dumps({{"args": sys.argv[1:], "cwd": os.getcwd()}}).encode())
s.shutdown(socket.SHUT_WR)
answer = json.loads(b"".join(iter(lambda: s.recv(65536), b"")))
sys.stdout.buffer.write(answer["stdout"].encode())
sys.stderr.buffer.write(answer["stderr"].encode())
sys.exit(answer["code"])
"""


def _answer(connection) -> None:
    from typer.testing import CliRunner

    from mha_trace.cli import app

    with connection:
        request = json.loads(b"".join(iter(lambda: connection.recv(65536), b"")))
        os.chdir(request["cwd"])
        result = CliRunner().invoke(app, request["args"])
        connection.sendall(json.dumps({"stdout": result.stdout, "stderr": result.stderr,
                                       "code": result.exit_code}).encode())


@contextmanager
def commands_answered_here(folder: Path):
    """PATH for a script whose `mha-trace` commands this process runs, one at a time."""
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "cli.socket"))
    server.listen()

    def serve():
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed: the script has ended
                return
            _answer(connection)

    shim = folder / "mha-trace"
    shim.write_text(SHIM.format(python=sys.executable, address=str(folder / "cli.socket")))
    shim.chmod(0o755)
    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"{folder}{os.pathsep}{os.environ['PATH']}"
    finally:
        server.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone would not)
        server.close()
        thread.join(timeout=60)
        assert not thread.is_alive()


def test_there_are_demos_for_the_lecture():
    assert len(DEMOS) >= 4


@pytest.mark.parametrize("demo", DEMOS, ids=lambda p: p.name)
def test_demo_output_matches_golden(demo, golden, tmp_path, monkeypatch):
    for name in ("COLUMNS", "FORCE_COLOR"):
        monkeypatch.delenv(name, raising=False)
    with commands_answered_here(tmp_path) as path:
        p = subprocess.run(["bash", str(demo)], capture_output=True, text=True,
                           env={**os.environ, "PATH": path}, timeout=300)
    assert p.returncode == 0, p.stderr
    assert p.stderr == ""
    golden(f"demos/{demo.stem}.txt", p.stdout)


def test_a_failing_command_stops_a_demo(tmp_path):
    """The shim passes on the exit code: a demo with `set -e` stops at a bad command line."""
    script = tmp_path / "bad.sh"
    script.write_text("set -euo pipefail\nmha-trace shapes --heads 3 --d-model 10\necho after\n")
    with commands_answered_here(tmp_path) as path:
        p = subprocess.run(["bash", str(script)], capture_output=True, text=True,
                           env={**os.environ, "PATH": path}, timeout=300)
    assert p.returncode == 2 and p.stdout == "" and p.stderr.startswith("Error: ")
