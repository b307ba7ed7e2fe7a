"""The code's shape: the library never imports the command line, no import cycle, records never
import their renderers, and no function runs much past 50 lines (the attention module's forward
reads like the seed texts' code, so it may)."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).parent.parent / "mha_trace"


def test_the_library_never_imports_the_command_line():
    package = PACKAGE
    leaks = []
    for path in package.rglob("*.py"):
        if "cli" in path.relative_to(package).parts or path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [
                a.name for a in node.names] if isinstance(node, ast.Import) else []
            leaks += [f"{path.name}: {n}" for n in names if n.startswith("mha_trace.cli")]
    assert leaks == []


def test_no_import_cycle_and_records_never_import_renderers():
    """Module-level imports inside mha_trace form no cycle; a renderer is found by its record's
    type (mha_trace.render), so no record module names a renderer file."""
    package = PACKAGE
    graph = {}
    for path in package.rglob("*.py"):
        name = ".".join(("mha_trace", *path.relative_to(package).with_suffix("").parts))
        name = name.removesuffix(".__init__")
        imported = set()
        for node in ast.parse(path.read_text()).body:  # module level only
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mha_trace"):
                imported |= {node.module} if node.module != "mha_trace" else {
                    f"mha_trace.{a.name}" for a in node.names}
        graph[name] = imported - {name}  # a package naming its own submodules

    def cycle(path):
        for nxt in sorted(graph.get(path[-1], ())):
            if nxt == path[0]:
                return [*path, nxt]
            if nxt not in path and nxt in graph and nxt > path[0]:  # each cycle once
                found = cycle([*path, nxt])
                if found:
                    return found
        return None

    assert [c for c in map(lambda m: cycle([m]), sorted(graph)) if c] == []
    for name in ("analysis", "shapes", "costs", "references", "model_analysis", "run"):
        assert "import" not in "".join(
            line for line in (package / f"{name}.py").read_text().splitlines()
            if "mha_trace.render" in line), name


def test_no_function_runs_past_fifty_lines():
    long = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body[1:] if ast.get_docstring(node) and len(node.body) > 1 else node.body
                lines = node.end_lineno - body[0].lineno + 1  # the signature and docstring aside
                if lines > 50 and (path.name, node.name) != ("attention.py", "forward"):
                    long.append(f"{path.relative_to(PACKAGE)}:{node.name} ({lines} lines)")
    assert long == []
