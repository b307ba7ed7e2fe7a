"""The code's shape: the library never imports the command line, the layers of pyproject.toml's
import-linter contract hold (no cycle, every import down), no module past 400 lines, and no
function much past 50 (the attention module's forward reads like the seed texts' code, so it may)."""

import ast
import pathlib

import pytest

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


@pytest.mark.slow
def test_the_layers_hold_and_no_import_forms_a_cycle():
    """import-linter's contracts in pyproject.toml: every import points down a layer, also the
    ones inside functions; the front ends reach the analyses through the views alone; and no two
    modules or folders import each other (lint-imports)."""
    import subprocess
    import sys

    code = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True))"
    p = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parent, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]
    assert "4 kept, 0 broken" in p.stdout


def test_the_modules_contract_names_every_module_and_the_guide_shows_it():
    """Every module is in a layer of its folder (pyproject.toml's second contract), and the table
    of layers in docs/code.md is that contract's (python docs/layers.py makes both)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "docs/layers.py", "--check"], cwd=PACKAGE.parent, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stdout


def test_no_module_runs_past_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}


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


def _module_functions():
    for path in PACKAGE.rglob("*.py"):
        if "cli" not in path.relative_to(PACKAGE).parts:
            yield path, [n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)]


def test_each_public_name_says_one_thing():
    """No two public functions of the library share a name (the command line's functions are
    named after its commands). `trace` is one interface: the tracer's, NumPy's twin and the API's
    door to them."""
    seen = {}
    for path, functions in _module_functions():
        for f in functions:
            if not f.name.startswith("_"):
                seen.setdefault(f.name, []).append(path.name)
    shared = {name: sorted(where) for name, where in seen.items() if len(where) > 1}
    assert shared == {"trace": ["api.py", "nptrace.py", "tracer.py"]}


def test_only_the_resolver_builds_runs():
    """One way in: run.py's builders are called by the resolvers alone (resolve.py; student.py, which
    resolves a student's class as verify builds it)."""
    builders = {"from_sizes", "from_config", "from_module", "from_model", "from_model_decode"}
    callers = []
    for path in PACKAGE.rglob("*.py"):
        if path.relative_to(PACKAGE).as_posix() in ("runs/run.py", "runs/resolve.py", "runs/student.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Name) and node.id in builders or \
                    isinstance(node, ast.alias) and node.name in builders:
                callers.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert callers == []


def test_a_run_cannot_change_after_it_is_built():
    import dataclasses

    import pytest

    from mha_trace.runs.resolve import RunOptions, resolve

    run = resolve(RunOptions(d_model=8, heads=2, seq=3, batch=1), "sizes")
    with pytest.raises(dataclasses.FrozenInstanceError):
        run.mask = None


@pytest.mark.slow
def test_ruff_finds_nothing_wrong():
    """ruff's pyflakes rules (pyproject.toml): no unused import or name, no undefined one, no
    syntax error, in the package, the tests, the docs' scripts and the benches."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "mha_trace", "tests",
                        "docs", "bench"], cwd=PACKAGE.parent, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout[-3000:]


@pytest.mark.slow
def test_the_type_checker_finds_nothing_wrong(tmp_path):
    """mypy over the layers a front end reads through (views/, analyses/, models/, runs/ and what
    they import; pyproject.toml's [tool.mypy]): each request, record and protocol is used as it is
    typed. A fresh cache each run, so nothing stale passes."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "mypy", "--cache-dir", str(tmp_path)],
                       cwd=PACKAGE.parent, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:]


def test_no_golden_file_is_a_copy_of_another():
    """One golden file per distinct output: where two tests print the same thing, they compare
    with one file (a copy would let the two drift apart unnoticed when one is refreshed)."""
    import hashlib

    golden = pathlib.Path(__file__).parent / "golden"
    seen = {}
    for path in sorted(golden.rglob("*")):
        if path.is_file():
            seen.setdefault(hashlib.sha256(path.read_bytes()).hexdigest(), []).append(
                str(path.relative_to(golden)))
    assert [names for names in seen.values() if len(names) > 1] == []


def test_a_head_is_named_one_way():
    """A head is a Head: layer and head from 1, "L.H" its name, (layer, head) from 0 its place in
    a grid; no module writes "L.H" itself (each did, and two counted from 0 inside one record)."""
    import re

    from mha_trace.core.head import Head, head_names

    assert (Head(4, 3).name, str(Head.at(3, 2)), Head(4, 3).index) == ("4.3", "4.3", (3, 2))
    assert head_names([(1, 1), (2, 12)]) == ["1.1", "2.12"] and Head(2, 1) < Head(2, 3)
    inline = re.compile(r"\{(l|layer|a\[0\]|[a-z_.]*\[0\](\[0\])?)( \+ 1)?\}\.\{(h|head|b|[a-z_.]*\[1\])( \+ 1)?\}")
    found = [f"{path.relative_to(PACKAGE)}:{i}" for path in PACKAGE.rglob("*.py")
             for i, line in enumerate(path.read_text().splitlines(), 1) if inline.search(line)]
    assert found == [], found
