"""The example implementations shipped with the tool: found, named and described without importing
them (no torch here: `mha-trace examples` lists them fast).

`--module example:l04` runs examples/l04_mha.py's attention class from any directory.
"""

import ast
from dataclasses import dataclass
from pathlib import Path

from mha_trace.errors import MhaError


def examples_dir() -> Path:
    """examples/ inside an installed wheel, or beside the package in a source checkout."""
    here = Path(__file__).resolve().parent.parent
    inside = here / "examples"
    return inside if inside.is_dir() else here.parent / "examples"


@dataclass(frozen=True)
class Example:
    name: str  # "l04"
    path: Path
    classes: tuple  # the nn.Module classes defined in the file, in order
    about: str  # the file's docstring, first line

    @property
    def spec(self) -> str:
        return f"example:{self.name}"


def _short(stem: str) -> str:
    return stem.removesuffix("_mha").removesuffix("_attention")


def examples() -> list[Example]:
    found = []
    for path in sorted(examples_dir().glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # torch modules, and classes with a forward (the chapter's NumPy implementation)
        classes = tuple(node.name for node in tree.body if isinstance(node, ast.ClassDef) and (
            any("Module" in ast.unparse(base) for base in node.bases) or any(
                isinstance(f, ast.FunctionDef) and f.name == "forward" for f in node.body)))
        doc = (ast.get_docstring(tree) or "").strip().splitlines()
        found.append(Example(_short(path.stem), path, classes, doc[0] if doc else ""))
    return found


def example_path(spec: str) -> str:
    """'example:l04' or 'example:l04:Class' -> 'path/to/l04_mha.py:Class'."""
    _, _, rest = spec.partition(":")
    name, _, cls = rest.partition(":")
    known = {e.name: e for e in examples()} | {e.path.stem: e for e in examples()}
    if name not in known:
        names = ", ".join(e.name for e in examples())
        raise MhaError(f"module {spec}: no bundled example '{name}' (examples: {names}; see "
                       f"mha-trace examples)", quantity="module")
    example = known[name]
    return f"{example.path}:{cls or example.classes[0]}"
