"""Keep the README's examples real: every ``` block that starts with `$ mha-trace ...` holds
exactly what that command prints (piped, no colour). Blocks fenced as ```text are illustrations.

    python docs/readme.py            # rewrite the blocks from the current output
    python docs/readme.py --check    # exit 1 and name the blocks that differ
"""

import os
import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
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
    text = README.read_text()
    if "--check" in sys.argv:
        stale = [cmd for _, cmd, body in blocks(text) if output(cmd) != body]
        for cmd in stale:
            print(f"README block differs from the real output: $ {cmd}")
        return 1 if stale else 0
    new = BLOCK.sub(lambda m: f"```\n$ {m.group(1)}\n{output(m.group(1))}```", text)
    README.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
