"""Keep the README's and the guide's examples real: every ``` block that starts with
`$ mha-trace ...` in README.md or docs/*.md holds exactly what that command prints (piped, no
colour). Blocks fenced as ```text are illustrations.

    python docs/readme.py            # rewrite the blocks from the current output
    python docs/readme.py --check    # exit 1 and name the blocks that differ
"""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
PAGES = [README, *sorted(README.parent.glob("docs/*.md"))]
BLOCK = re.compile(r"```\n\$ (mha-trace[^\n]*)\n(.*?)```", re.S)


def output(command: str) -> str:
    """What the command prints, stdout (through the block's `| head`/`| tail`/`| sed`/`| grep`, if
    any) then stderr, as a pipe sees it."""
    line, _, pipe = command.split("  #")[0].partition(" | ")  # drop a trailing comment
    shown, errors = printed(line)
    if pipe:
        shown = subprocess.run(["bash", "-c", pipe], input=shown, capture_output=True, text=True,
                               timeout=60).stdout
    return shown + errors


def printed(line: str) -> tuple[str, str]:
    """(stdout, stderr) of one command line, piped, without colour. Run in this process, with this
    checkout's code: the same command line, parsed by the same app, without a second interpreter
    importing torch. Blocks that show one command through different pipes share its run."""
    import contextlib
    import shlex

    from typer.testing import CliRunner

    if line in PRINTED:
        return PRINTED[line]
    if str(README.parent) not in sys.path:
        sys.path.insert(0, str(README.parent))
    from mha_trace.cli import app

    saved = {k: os.environ.pop(k) for k in ("COLUMNS", "FORCE_COLOR") if k in os.environ}
    try:
        with contextlib.chdir(README.parent):
            result = CliRunner().invoke(app, shlex.split(line)[1:], catch_exceptions=False)
    finally:
        os.environ.update(saved)
    PRINTED[line] = result.stdout, result.stderr
    return PRINTED[line]


PRINTED: dict = {}  # command line -> (stdout, stderr), for this process


def blocks(text: str):
    for m in BLOCK.finditer(text):
        yield m, m.group(1), m.group(2)


def main() -> int:
    if "--check" in sys.argv:
        stale = [(page.name, cmd) for page in PAGES for _, cmd, body in blocks(page.read_text())
                 if output(cmd) != body]
        for name, cmd in stale:
            print(f"{name}: a block differs from the real output: $ {cmd}")
        return 1 if stale else 0
    for page in PAGES:
        text = page.read_text()
        page.write_text(BLOCK.sub(lambda m: f"```\n$ {m.group(1)}\n{output(m.group(1))}```", text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
