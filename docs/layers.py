"""The modules inside each folder as layers: one place (pyproject.toml's second import-linter
contract) names every module, and docs/code.md's table of them is made from it.

    python docs/layers.py            # rewrite the contract from the imports as they are, and the table
    python docs/layers.py --check    # exit 1 when a module is missing from either, or they differ

A module's layer is how far down its folder its imports reach: one that imports no module of its
folder is at the bottom, one that imports only those is above them, and so on; modules of one
layer do not import each other (import-linter's `:`). A new module that imports upward breaks the
contract, as it should; a new module anywhere is missing until this script places it.
"""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT, CODE = ROOT / "pyproject.toml", ROOT / "docs" / "code.md"
FOLDERS = ("cli", "explorer", "views", "render", "analyses", "runs", "models", "core", "io")
CONTRACT = re.compile(r'(name = "Inside the folders, modules are layers too"\ntype = "layers"\nlayers = \[\n)(.*?)(\n\])', re.S)
TABLE = re.compile(r"(<!-- layers: made by docs/layers.py -->\n)(.*?)(<!-- /layers -->)", re.S)


def modules(folder: str) -> list[str]:
    return sorted(f"mha_trace.{folder}.{p.stem}" for p in (ROOT / "mha_trace" / folder).glob("*.py")
                  if p.stem != "__init__")


def layers() -> list[list[str]]:
    """Each folder's modules by layer, top first, the folders in their own layers' order."""
    import grimp

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    graph = grimp.build_graph("mha_trace")
    found = []
    for folder in FOLDERS:
        names = modules(folder)
        level: dict = {}

        def depth(m: str, seen=()) -> int:
            if m not in level:
                below = [n for n in graph.find_modules_directly_imported_by(m) if n in names and n not in seen]
                level[m] = 1 + max((depth(n, seen + (m,)) for n in below), default=-1)
            return level[m]

        for m in names:
            depth(m)
        found += [sorted(m for m in names if level[m] == k) for k in range(max(level.values()), -1, -1)]
    return found


def contract_text(found: list) -> str:
    return "\n".join(f'    "{" : ".join(layer)}",' for layer in found)


def table_text(found: list) -> str:
    rows = ["| folder | its modules, top layer first (`·` between modules that do not import each other) |",
            "|---|---|"]
    for folder in FOLDERS:
        mine = [layer for layer in found if layer[0].split(".")[1] == folder]
        shown = " → ".join(" · ".join(f"`{m.rsplit('.', 1)[1]}`" for m in layer) for layer in mine)
        rows.append(f"| `{folder}/` | {shown} |")
    return "\n".join(rows) + "\n"


def listed() -> set:
    body = CONTRACT.search(PYPROJECT.read_text()).group(2)
    return {m.strip() for m in re.findall(r"mha_trace\.[\w.]+", body)}


def main() -> int:
    if "--check" in sys.argv:
        every = {m for folder in FOLDERS for m in modules(folder)}
        missing = sorted(every - listed())
        stale = TABLE.search(CODE.read_text()).group(2) != table_text(_contract_layers())
        for m in missing:
            print(f"pyproject.toml: {m} is in no layer of the modules' contract (python docs/layers.py)")
        if stale:
            print("docs/code.md: the table of layers differs from the contract (python docs/layers.py)")
        return 1 if missing or stale else 0
    found = layers()
    PYPROJECT.write_text(CONTRACT.sub(lambda m: m.group(1) + contract_text(found) + m.group(3), PYPROJECT.read_text()))
    CODE.write_text(TABLE.sub(lambda m: m.group(1) + table_text(found) + m.group(3), CODE.read_text()))
    return 0


def _contract_layers() -> list:
    """The layers as the contract lists them now."""
    body = CONTRACT.search(PYPROJECT.read_text()).group(2)
    return [[m.strip() for m in line.strip().strip('",').split(":")] for line in body.splitlines() if line.strip()]


if __name__ == "__main__":
    sys.exit(main())
