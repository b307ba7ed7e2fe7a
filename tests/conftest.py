"""Shared test helpers: golden files, a CLI runner, and processes that run the code under test.

The suite runs from any directory (`cd /tmp && python -m pytest /path/to/tests`): every test runs
in the repository's root, and a subprocess's `mha-trace` is a shim for `python -m mha_trace` with
this checkout first on PYTHONPATH, never whatever `mha-trace` comes first on PATH.
"""

import contextlib
import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

GOLDEN = Path(__file__).parent / "golden"
REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # this checkout's package, not an installed copy
    sys.path.insert(0, str(REPO))

from snapshots import differences  # noqa: E402 (tests/ is on the path, as for conftest)


def _torch_as_the_command_line_imports_it():
    """The command line's process imports torch without its Python meta kernels, and loads them
    where a forward on the meta device needs them (`speedups.meta_kernels_later`): the tests
    that run commands in this process run them with the same torch."""
    import importlib.util

    from mha_trace import speedups

    with speedups.meta_kernels_later(importlib.util.find_spec("torch")):
        import torch  # noqa: F401


@pytest.fixture(scope="session", autouse=True)
def code_under_test(tmp_path_factory):
    """`mha-trace` in subprocesses runs this checkout's package with this interpreter. Its
    modules are compiled once here: where PYTHONDONTWRITEBYTECODE is set (as on CI machines),
    every one of the suite's processes would otherwise compile them again (about 0.1 s each)."""
    import compileall

    compileall.compile_dir(REPO / "mha_trace", quiet=1)
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "mha-trace"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m mha_trace "$@"\n')
    shim.chmod(0o755)
    saved = {k: os.environ.get(k) for k in ("PATH", "PYTHONPATH")}
    os.environ["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), saved["PYTHONPATH"]]))
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="session")
def kept_weights():
    import contextlib

    with contextlib.ExitStack() as stack:
        yield stack


@pytest.fixture(autouse=True)
def smollm2_dequantised_once(kept_weights):
    """Once a test has loaded SmolLM2 in this worker, its weights stay dequantised for the rest
    of the session, as they do inside one command that runs many passes (`Model.resident`):
    otherwise each pass of each test dequantises the 4-bit blocks again (about 1 s). The path
    that dequantises on every pass is still what each subprocess runs, and test_smollm2 checks
    that both give the same numbers."""
    yield
    module = sys.modules.get("mha_trace.models.smollm2")
    model = getattr(module, "_loaded", None)
    if model is not None and model._kept is None:
        kept_weights.enter_context(model.resident())


SHARED = [  # (module, analysis, what makes two calls the same): each asked for from several places
    ("mha_trace.analyses.induction", "induction",  # a test's fixture, the guide, --help's example
     lambda a: (a["model"], a["n"], tuple(a["seeds"]), a["ablate_top"])),
    ("mha_trace.analyses.model_analysis", "rank_heads",  # the guide, a golden screen, a test
     lambda a: (a["sentence"].model, tuple(a["sentence"].ids))),
    ("mha_trace.analyses.model_analysis", "survey",  # the guide, the screens at three widths, the tests
     lambda a: (a["model"], repr(a["corpus"]), a["source"], repr(a["targets"]), a["effect"])),
    ("mha_trace.analyses.pruning", "prune",  # a test's JSON and text of one small corpus
     lambda a: (a["model"], tuple(a["corpus"].sentences),
                sys.modules["mha_trace.analyses.pruning"].FRACTIONS)),  # as a test may set them
    ("mha_trace.analyses.kvcache", "masked_pass",  # the guide's cache lab, --help's, the API's
     lambda a: (a["model"], tuple(a["ids"]), a["s"])),
    ("mha_trace.analyses.patching", "patch",  # the README's, the guide's and the reference's pairs
     lambda a: (a["model"], a["clean"], a["corrupt"], repr(a["metric"]), a["noising"], a["by_input"],
                None if a["by_position"] is None else tuple(a["by_position"]))),
    # Whisper's views of one recording: the guide's, --help's, the tests' and the conformance test's
    *((f"mha_trace.analyses.{module}", function, lambda a: _recording(a))
      for module, functions in (("alignment", ("hear", "listen", "cross_heads")),
                                ("encoder", ("encoder_heads", "listen_frame")),
                                ("frame_why", ("cross_why", "encoder_why")))
      for function in functions),
]


def _recording(arguments: dict) -> tuple:
    """What makes two calls on one recording the same: the model, the file it was read from as it
    is on disk (its path, size and time), every other argument."""
    source = arguments["heard"].source
    found = os.stat(source)
    return (arguments["model"], os.path.realpath(source), found.st_size, found.st_mtime_ns,
            *(repr(v) for k, v in arguments.items() if k not in ("model", "heard")))


@pytest.fixture(scope="session", autouse=True)
def every_renderer():
    """Tests of an analysis make its record without a view, and a view is what imports a record's
    renderer (the command line's processes, the notebook's kernel and the parity table check that
    each view does): here every renderer is imported once, as the views together would."""
    import importlib
    import pkgutil

    import mha_trace.render

    for found in pkgutil.iter_modules(mha_trace.render.__path__):
        importlib.import_module(f"mha_trace.render.{found.name}")


@pytest.fixture(scope="session", autouse=True)
def each_shared_analysis_once(tmp_path_factory):
    """A corpus survey, SmolLM2's induction survey (eight passes of the model), its ranking of all
    270 heads, its pruning curve, the cache lab's masked passes, a patch and Whisper's views of a
    recording are each asked for from several places: each runs once for the same model object
    (the object itself, never another's id) and the same settings; each caller renders it its own
    way. For a model loaded from its package's files, once for the whole run: the workers share it
    (`once_per_run_value`)."""
    import importlib
    import inspect

    saved = []
    for name, function, same in SHARED:
        module = importlib.import_module(name)
        real, found = getattr(module, function), {}

        def shared(*args, real=real, found=found, same=same, function=function, **kwargs):
            bound = inspect.signature(real).bind(*args, **kwargs)
            bound.apply_defaults()
            try:
                key = same(bound.arguments)
            except OSError:  # a file that is not there: the analysis says so itself
                return real(*args, **kwargs)
            if key not in found:
                portable = _portable(key)
                found[key] = real(*args, **kwargs) if portable is None else once_per_run_value(
                    tmp_path_factory, f"{function}-{portable}", lambda: real(*args, **kwargs))
            return found[key]

        saved.append((module, function, real))
        setattr(module, function, shared)
    yield
    for module, function, real in saved:
        setattr(module, function, real)


PACKAGED = ("mha_trace.models.minilm", "mha_trace.models.smollm2", "mha_trace.models.whisper")


def _portable(key: tuple) -> str | None:
    """A name for a shared analysis's key that means the same in every worker: each model one
    of the packaged ones (its files are every worker's), every other part shown by its value.
    None where a part is known only by its id (a model a test built, an object)."""
    import hashlib

    parts = []
    for part in key:
        if hasattr(part, "capabilities"):  # a model
            if type(part).__module__ not in PACKAGED:
                return None
            part = ("model", part.key, part.limits, str(getattr(part, "device", "")))
        parts.append(repr(part))
    if any(" at 0x" in part for part in parts):
        return None
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


@pytest.fixture(autouse=True)
def in_repo_root(monkeypatch):
    """Relative paths in tests (examples/, configs/) mean the checkout's, wherever pytest started."""
    monkeypatch.chdir(REPO)


@pytest.fixture(autouse=True)
def quick_tier_stays_quick(request, monkeypatch):
    """The quick tier (`pytest -m "not slow"`) leaves out the tests marked slow, each by its own
    `@pytest.mark.slow` or its module's `pytestmark`: what loads SmolLM2, trains, opens a browser
    or a Jupyter kernel, or starts processes. A test left unmarked that loads SmolLM2 fails there,
    saying so, the first time the tier runs."""
    if "not slow" not in (request.config.option.markexpr or ""):
        return
    from mha_trace.models import smollm2

    def refuse(*args, **kwargs):
        pytest.fail(f"{request.node.nodeid} loads SmolLM2: mark it @pytest.mark.slow")

    monkeypatch.setattr(smollm2, "load_smollm2", refuse)


def pytest_collection_modifyitems(items):
    """The modules that read the default training run come first, each whole and in its order:
    under pytest-xdist the first worker trains the run as it starts (`default_run`, once a run)
    and the other, which starts halfway down the list, reads it only once it is there (it had
    waited about 4 s for the lock, idle, when the notebook's tests came early in its half)."""
    reading = {item.path for item in items if "default_run" in getattr(item, "fixturenames", ())}
    items.sort(key=lambda item: item.path not in reading)  # stable: the same order in every worker


def pytest_collection_finish(session):
    """Everything alive after collection (torch, numpy, the test modules) lives to the end:
    frozen, the collector's full passes skip it (measured: a worker's collections took 6.5 s
    unfrozen, 2.8 s frozen)."""
    import gc

    gc.collect()
    gc.freeze()


def fewer_collections():
    """Importing the test modules (torch, numpy, the package) makes about 250,000 objects: at
    Python's default thresholds, (700, 10, 10), a worker spent 1.3 s of its collection in a dozen
    full passes over them. A larger first generation, and a full pass after 100 of the middle
    ones rather than 10, for the whole run."""
    import gc

    gc.set_threshold(50_000, 20, 100)


def a_heap_for_the_worker():
    """A worker keeps the memory it frees for its next test. glibc's defaults suit a short
    process: a block over 128 KiB is mapped afresh (the threshold rises only as mapped blocks of
    a size are freed) and free memory over twice that is handed back, so a worker running
    thousands of model passes and slides faulted its temporaries in page by page again and again
    (9.3 million page faults a run, 29 s of the kernel's time). Here blocks up to glibc's largest
    threshold (32 MiB) come from the heap, which grows 64 MiB at a time and is trimmed only past
    1 GiB free (6.9 million faults, 24 s). Processes of their own keep what the command line
    sets (`speedups.return_freed_memory`). Linux with glibc only."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 1024 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 1024 * 1024 * 1024)  # M_TRIM_THRESHOLD
        libc.mallopt(-2, 64 * 1024 * 1024)  # M_TOP_PAD
    except (OSError, AttributeError):
        pass


def build_each_app_once():
    """typer's CliRunner builds the click command from the app on every invoke (15 ms for this
    app, about 2,500 times a run: a tenth of the suite). A click command is built to be invoked
    many times, as the real `mha-trace` would be if it ran twice: build each app once."""
    import functools

    import typer.testing

    typer.testing._get_command = functools.cache(typer.testing._get_command)


def pytest_configure(config):
    """Under pytest-xdist each worker gets its own share of the cores (and torch as many threads),
    so two workers never run four busy threads on two cores; subprocesses inherit the share.
    The garbage collector's passes come less often from the start (`fewer_collections`), and
    freed memory stays in the worker's heap (`a_heap_for_the_worker`). torch is imported last, as
    the command line imports it, with the worker's share of threads."""
    config.addinivalue_line("markers", "slow: left out of the quick tier (pytest -m 'not slow')")
    build_each_app_once()
    fewer_collections()
    a_heap_for_the_worker()
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker and count and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        share = set(cores[int(worker.removeprefix("gw")) % len(cores)::int(count)]) or set(cores)
        os.sched_setaffinity(0, share)
        os.environ["OMP_NUM_THREADS"] = str(len(share))  # read once, when torch loads OpenMP
    if not worker and getattr(config.option, "numprocesses", None):
        return  # pytest-xdist's controller runs no test: torch would only delay its workers
    _torch_as_the_command_line_imports_it()


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite tests/golden/* from the current output instead of comparing")


@pytest.fixture
def golden(request):
    """golden("name.txt", text): compare with tests/golden/name.txt (or rewrite it when asked),
    by what the text means (tests/snapshots.py): the layout and words exactly, numbers to the
    digits that are not float noise."""
    update = request.config.getoption("--update-golden")

    def check(name: str, text: str):
        path = GOLDEN / name
        if update:
            path.write_text(text)
            return
        assert path.exists(), f"missing golden file {path}; run pytest --update-golden once"
        found = differences(text, path.read_text())
        if found:
            actual = Path(os.environ.get("TMPDIR", "/tmp")) / f"actual-{path.name}"
            actual.write_text(text)
            raise AssertionError(f"output differs from {path} (pytest --update-golden); "
                                 f"this run's output is in {actual}\n" + "\n".join(found[:5]))

    return check


@pytest.fixture
def cli(monkeypatch):
    """cli("shapes", "--heads", "4") -> click Result, as a piped, colourless run."""
    from mha_trace.cli import app

    monkeypatch.delenv("COLUMNS", raising=False)
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(app, list(args), catch_exceptions=False)

    return invoke


@pytest.fixture
def golden_run(cli, golden):
    """golden_run("name.txt", args): run the CLI, expect success, compare stdout with the golden file."""

    def check(name: str, args):
        result = cli(*args)
        assert result.exit_code == 0, result.stderr
        golden(name, result.stdout)

    return check


def once_per_run(tmp_path_factory, name: str, make) -> Path:
    """A folder that `make(folder)` fills once for the whole run: the pytest-xdist workers share
    it (the first fills it under a lock; a folder is only ever seen full)."""
    import fcntl
    import shutil

    root = tmp_path_factory.getbasetemp()  # this run's, or, under pytest-xdist, this worker's:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the folder of all the workers of this run
    folder = root / name
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not folder.exists():
            partial = root / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            make(partial)
            partial.rename(folder)
    return folder


def once_per_run_value(tmp_path_factory, name: str, make):
    """What `make()` returns, made once for the whole run: the first worker to ask makes it and
    leaves it pickled for the others (`once_per_run`); a value pickle cannot keep is made by each."""
    import pickle

    made = []

    def fill(folder):
        made.append(make())
        with contextlib.suppress(pickle.PicklingError, TypeError, AttributeError):
            (folder / "value.pickle").write_bytes(pickle.dumps(made[0]))

    file = once_per_run(tmp_path_factory, name, fill) / "value.pickle"
    if made:
        return made[0]
    return pickle.loads(file.read_bytes()) if file.exists() else make()


PARSED = {}  # (path, size, time) -> gguf's reader, for this worker's session


@contextlib.contextmanager
def gguf_read_once():
    """While it lasts, gguf's reader parses each GGUF file once for the worker's session (about
    2.5 s for SmolLM2's, most of it the 49,152-token vocabulary): the cache's tests rebuild the
    cache from a file that no test changes. What is built from the parse is built again each
    time; a file changed on disk (another size or time) is parsed again."""
    import gguf

    reader = gguf.GGUFReader

    def read(path, mode="r"):
        if mode != "r":
            return reader(path, mode)
        stat = os.stat(path)
        key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns)
        if key not in PARSED:
            PARSED[key] = reader(path, mode)
        return PARSED[key]

    gguf.GGUFReader = read
    try:
        yield
    finally:
        gguf.GGUFReader = reader


@pytest.fixture
def gguf_parsed_once():
    """A test that rebuilds the SmolLM2 cache (or reads the file's metadata as its reference)
    from the parse shared by the worker (`gguf_read_once`)."""
    with gguf_read_once():
        yield


@pytest.fixture(scope="session")
def built_cache(tmp_path_factory):
    """A SmolLM2 cache folder built the normal way, once for the whole run; every test copies it
    before touching it."""
    from mha_trace.models import gguf_meta, smollm2

    def make(folder):
        with gguf_read_once():
            gguf_meta.build_meta(smollm2.gguf_path(), folder / "smollm2", smollm2.INSTALL)

    folder = once_per_run(tmp_path_factory, "smollm2-cache", make) / "smollm2"
    assert gguf_meta.read_meta(folder, smollm2.gguf_path().stat().st_size) is not None  # sound
    return folder


@pytest.fixture(scope="session")
def train_once(tmp_path_factory):
    """train_once(spec) -> the Training `run_training(spec)` makes, trained once for the whole run
    (the guide's 700-step runs, which test_train's exercise reads too). Only where a test reads
    a run, never where it checks that training twice gives the same bytes."""
    import hashlib

    from mha_trace.models import training

    real = training.run_training
    return lambda spec: once_per_run_value(
        tmp_path_factory, "trained-" + hashlib.sha256(repr(spec).encode()).hexdigest()[:16], lambda: real(spec))


@pytest.fixture(scope="session")
def default_run(tmp_path_factory) -> Path:
    """`mha-trace train`'s default run (induction, 600 steps), saved, trained once for the whole
    run: one thread, as the command trains, so its numbers are the guide's to the last digit."""
    import torch

    import mha_trace

    def make(folder):
        before = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            mha_trace.train("induction", save=str(folder / "run.pt"))
        finally:
            torch.set_num_threads(before)

    return once_per_run(tmp_path_factory, "default-run", make) / "run.pt"


@pytest.hookimpl(tryfirst=True)
def pytest_unconfigure(config):
    """A pytest-xdist worker leaves as soon as its session is over: its last result and its
    "finished" are sent by then (the controller takes that worker's end as expected), and the
    rest would be the garbage collector's passes over the heap (torch, three models, about 2.5
    GB) and the interpreter's teardown of it, about 1.7 s that the run waited for. Anything such
    a pass found could no longer reach the controller anyway."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


@pytest.fixture
def kept_slides(monkeypatch):
    """kept_slides(*modules): a list that gets each figure those slide modules make, kept for the
    test instead of written, and let go by pyplot at once (a worker held every figure a test kept,
    and pyplot warned past 20)."""
    made = []

    def kept(plt, fig, path, bg):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        plt.close(fig)
        FigureCanvasAgg(fig)  # pyplot's close takes its canvas: drawn and measured with Agg's
        made.append(fig)

    def keep(*modules):
        for module in modules:
            monkeypatch.setattr(module, "_save", kept)
        return made
    return keep

