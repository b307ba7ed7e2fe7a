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
    """What the command prints, stdout then stderr, as a pipe sees it."""
    command = command.split("  #")[0]  # drop a trailing comment
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "FORCE_COLOR")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(README.parent), env.get("PYTHONPATH")]))
    # this checkout's code, never whatever `mha-trace` comes first on PATH
    shim = f'mha-trace() {{ "{sys.executable}" -m mha_trace "$@"; }}; '
    p = subprocess.run(["bash", "-c", shim + command], capture_output=True, text=True, env=env,
                       cwd=README.parent, timeout=300)
    return p.stdout + p.stderr


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
