"""The live explorer: its session against the CLI's records, Textual's headless pilot driving
every pane by key presses, snapshots of a few screens (text and backgrounds), one real pseudo-terminal, and --step.

The numbers asserted come from the records the other commands print (analyse, walk, ablate,
trace_run), computed independently here; the explorer must show those, not numbers of its own.
"""

import asyncio
import os
import pty
import re
import select
import struct
import subprocess
import sys
import time

import numpy as np
import pytest

from mha_trace.analyses.analysis import ablate_heads, analyse
from mha_trace.analyses.walk import walk
from mha_trace.runs.config import load_config
from mha_trace.runs.run import from_config
from mha_trace.errors import MhaError
from mha_trace.render.matrices import fmt
from mha_trace.explorer.session import open_session, prepare
from snapshots import screen

ANSI = re.compile(r"\x1b\[[0-9;?<>=]*[A-Za-z~]|\x1b[()][A-Z0-9]|\x1b[=>]")


# the session: the CLI's records, recomputed on every choice
def test_session_resplits_masks_and_ablates_like_the_commands():
    s = open_session()
    assert s.view().weights.shape == (2, 5, 5)
    s.step_heads(1)  # 1, 2, 4: up from 2
    assert s.heads == 4
    np.testing.assert_array_equal(s.view().weights, analyse(from_config(load_config().with_overrides(heads=4))).weights)
    s.cycle_mask()
    assert s.mask == "causal"
    assert np.array_equal(s.view().mask, np.tril(np.ones((5, 5), bool)))
    s.cycle_mask()  # a window of max(2, 5 // 2) = 2 keys: the query and the one before it
    assert s.mask == "window" and s.config.window == 2
    assert np.array_equal(s.view().mask, np.tril(np.ones((5, 5), bool)) & np.triu(np.ones((5, 5), bool), -1))
    s.cycle_mask()
    assert s.mask == "none" and s.view().mask is None
    s.toggle(3)
    expected = ablate_heads(from_config(load_config().with_overrides(heads=4)), [3])
    assert s.ablation().total == pytest.approx(expected.total, abs=1e-15)
    s.toggle(3)
    assert s.ablation() is None


def test_session_walk_is_explains_walk():
    s = open_session()
    s.set_position(1)
    w = s.walk()
    assert w.token == "cat"
    assert [t.weight for t in w.heads[0].terms] == pytest.approx([0.3664, 0.0891, 0.3664, 0.0891, 0.0891], abs=1e-4)


def test_session_from_flags_traces_at_batch_2_like_shapes():
    s = open_session(d_model=64, heads=4, seq=6)
    assert s.report().steps[0].shape == (2, 6, 64)
    assert s.view().weights.shape == (4, 6, 6) and s.tokens[0] == "t1"


@pytest.mark.parametrize("options,message", [
    ({"pane": "nope"}, "pane 'nope' is not one of trace, heads, token, split, ablate"),
    ({"mask": "diagonal"}, "mask 'diagonal' is not one of none, causal, window"),
    ({"model": "minilm", "d_model": 64}, "--d-model does not go with --model"),
    ({"model": "gpt5"}, "model 'gpt5' is not one of minilm, smollm2, whisper (or a run saved by mha-trace train: --checkpoint run.pt)"),
    ({"layer": 2}, "--layer goes with --model (e.g. --model minilm)"),
    ({"config": "chicken-road", "seq": 4}, "--config fixes the sizes"),
    ({"d_model": 10, "heads": 3}, "d_model=10 is not divisible by heads=3"),
    ({"seq": 65}, "at most 64 tokens"),
    ({"model": "minilm", "sentence": "word " * 70}, "at most 64 (this sentence has 72;"),
    ({"config": "no-such-config"}, "no-such-config: no such file"),
])
@pytest.mark.slow
def test_bad_options_are_refused_before_any_screen(options, message):
    with pytest.raises(MhaError) as e:
        prepare(**options)()  # a model's are checked as it opens, before its first screen
    assert message in str(e.value)


@pytest.mark.slow
def test_prepare_for_a_config_imports_neither_torch_nor_textual():
    code = ("import sys; from mha_trace.explorer.session import prepare; prepare(config='chicken-road', "
            "mask='causal', heads=4) and None; print('torch' in sys.modules, 'textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"]


# the app, driven by Textual's headless pilot
@pytest.fixture(autouse=True)
def quicker_idle_checks(monkeypatch):
    """The pilot waits after each key until the process has been idle for a moment: Textual
    looks in windows of 20 ms, and the waits were a third of this file's time. Windows of 5 ms
    with the same rule (under 5% of a window busy) see the same idle app (a Textual without
    these names simply waits as it always did)."""
    import textual._wait

    monkeypatch.setattr(textual._wait, "SLEEP_GRANULARITY", 0.005, raising=False)
    monkeypatch.setattr(textual._wait, "SLEEP_IDLE", 0.005 / 20, raising=False)


def drive(keys=(), snapshot=None, **options):
    """Open the explorer on `options`, press `keys`, return the app with what it showed:
    texts (each Static's), cells (the heads table), row (the trace's), active (the pane)."""
    theme = options.pop("theme", "dark")
    pane = options.pop("pane", "trace")

    async def body(app, pilot):
        await pilot.pause()
        for key in keys:
            await pilot.press(key)
        await pilot.wait_for_scheduled_animations()  # a table scrolled to its cursor
        await pilot.pause()
        app.shown = screen(app) if snapshot else None
        app.texts = {w.id: _plain(w) for w in app.query("Static") if w.id}
        matrix = app.query_one("#matrix")
        app.cells = [[matrix.get_cell_at((i, j)).plain.strip() for j in range(1, len(matrix.columns))]
                     for i in range(matrix.row_count)]
        app.labels = [c.label.plain for c in matrix.columns.values()]
        app.row_labels = [matrix.get_cell_at((i, 0)).plain for i in range(matrix.row_count)]
        app.fixed = matrix.fixed_columns
        app.matrix_width = matrix.virtual_size.width
        app.row = app.query_one("#steps").cursor_row
        app.active = app.query_one("#panes").active

    return with_app(body, prepare(pane=pane, **options), theme, pane)[0]


def with_app(body, open_session=None, theme="dark", pane="trace"):
    """Run `await body(app, pilot)` in the explorer (80×24) once its session is open; returns
    (app, what body returned)."""
    from mha_trace.explorer.app import Explorer

    async def run():
        app = Explorer(open_session or prepare(), theme, pane)
        async with app.run_test(size=(80, 24)) as pilot:
            while app.session is None and app.failure is None:
                await pilot.pause(0.02)
            result = await body(app, pilot)
        return app, result

    return asyncio.run(run())


def _plain(widget) -> str:
    from rich.console import Console

    console = Console(width=200, no_color=True, file=open(os.devnull, "w"))
    with console.capture() as c:
        console.print(widget.renderable if hasattr(widget, "renderable") else widget.content)
    return c.get()


def _cell(app, row, key) -> str:
    """The heads pane's cell for query `row` and key `key` (both from 0), as shown."""
    return app.cells[row][key]


def test_trace_pane_moves_row_by_row_with_source_and_notes():
    app = drive(["down"] * 13)
    report = app.session.report()
    step = report.steps[13]
    assert step.op == "matmul" and step.shape == (1, 2, 5, 5)
    assert app.row == 13
    assert "shape [1, 2, 5, 5]   stride (50, 25, 5, 1)   contiguous yes   new tensor" in app.texts["detail"]
    assert "Matrix product over the last two dims" in app.texts["detail"]
    # the module's source around the step, its line marked
    assert f"{step.line} scores = torch.matmul(Q, K.transpose(-2, -1))" in re.sub(r"\s+", " ", app.texts["source"])


def test_heads_pane_shows_the_views_weights_and_follows_the_cursor():
    app = drive(["2", "]", "down", "right"])
    view = analyse(from_config(load_config()))
    assert app.session.head == 2
    # query 'cat', key 'cat': head 2's weight, as heads prints it
    assert _cell(app, 1, 1) == fmt(view.weights[1, 1, 1], 4)
    assert _cell(app, 0, 1) == fmt(view.weights[1, 0, 1], 4) + "*"  # 'The' -> 'cat' is the row's top
    assert app.texts["cell"].startswith(f"'cat' looks at 'cat': {view.weights[1, 1, 1]:.6f}, rank")


def test_enter_on_a_cell_walks_that_query_in_the_token_pane():
    app = drive(["2", "down", "down", "enter"])
    assert app.active == "token"
    assert app.session.position == 2
    expected = walk(analyse(from_config(load_config())), 2)
    assert "the query 'sat' (position 2) through head 1" in app.texts["walk"]
    assert fmt(expected.heads[0].terms[2].weight, 4) in app.texts["walk"]


def test_token_pane_steps_through_tokens():
    app = drive(["3", "t", "t", "t", "T"])
    assert app.session.position == 2 and "token 'sat'" in app.texts["status"]


def test_plus_resplits_live_and_every_pane_follows():
    app = drive(["4", "plus"])
    assert app.session.heads == 4
    assert "H=4  d_k=1" in app.texts["status"]
    assert "Head counts: 1  2  [4]" in app.texts["maps"]
    rows = [analyse(from_config(load_config().with_overrides(heads=4))).weights[h] for h in range(4)]
    distinct = [len({tuple(np.round(row, 4)) for row in w}) for w in rows]  # by hand
    assert ("distinct weight rows per head: " + ", ".join(map(str, distinct))
            in re.sub(r"\s+", " ", app.texts["maps"]))
    app = drive(["minus", "minus", "minus"])  # 2 -> 1, then no further
    assert app.session.heads == 1


def test_mask_key_cycles_none_causal_window():
    app = drive(["2", "m"])
    assert app.session.mask == "causal"
    assert _cell(app, 0, 1) == "·"  # 'The' may not look at 'cat'
    assert _cell(app, 0, 0) == "1.0000*"
    app = drive(["m", "m"])
    assert "mask=window 2" in app.texts["status"]


def test_space_switches_a_head_off_and_the_output_moves():
    app = drive(["5", "space"])
    assert app.session.off == {1}
    expected = ablate_heads(from_config(load_config()), [1])
    text = re.sub(r"\s+", " ", app.texts["ablation"])
    assert "Heads 1:off 2:on" in text
    assert f"Total L2 distance: {fmt(expected.total, 4)}" in text
    app = drive(["5", "space", "a"])
    assert app.session.off == frozenset() and "Every head is on" in app.texts["ablation"]


def test_help_and_quit():
    from mha_trace.explorer.app import Help

    async def body(app, pilot):
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, Help)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, Help)
        await pilot.press("d")
        assert app.theme == "textual-light"
        await pilot.press("q")
        await pilot.pause()

    app, _ = with_app(body)
    assert app.return_code in (0, None)


def test_the_mouse_picks_a_pane_and_a_cell():
    async def body(app, pilot):
        await pilot.click("#--content-tab-heads")
        await pilot.pause()
        active = app.query_one("#panes").active
        table = app.query_one("#matrix")
        # the cell of query 'sat' (row 2) and key 'on' (column 4 after the labels)
        region = table._get_cell_region((2, 4))
        await pilot.click("#matrix", offset=(region.x + 1 - table.scroll_x, region.y - table.scroll_y))
        await pilot.pause()
        return active, table.cursor_coordinate

    _, (active, cursor) = with_app(body)
    assert active == "heads" and tuple(cursor) == (2, 4)


@pytest.mark.slow
def test_ctrl_c_quits_as_an_interruption():
    """Ctrl-C leaves the explorer like any command it interrupts: exit 130 and one line."""
    code, screen = _in_pty(["mha-trace", "explore"], [b"\x03"], b"self.W_q")
    assert code == 130 and "Error: interrupted (Ctrl-C)" in screen
    assert "Traceback" not in screen


def test_a_models_split_and_mask_are_fixed_and_say_so():
    from mha_trace.models import load_model

    app = drive(["greater_than_sign", "greater_than_sign", "plus", "m"], model="minilm",
                pane="heads")
    assert app.session.layer == 3 and app.session.heads == 12  # refused, not crashed
    s = load_model("minilm").encode("The animal didn't cross the street because it was too tired.")
    # at 80 columns the tightest layout (2 decimals, no leading zero), the table scrolls
    assert _cell(app, 0, 0) == fmt(s.weights[2, 0, 0, 0], 2).removeprefix("0") + (
        "*" if s.weights[2, 0, 0].argmax() == 0 else "")
    assert len(app.labels) == 17 and app.matrix_width == 90
    assert app.texts["heads-title"].startswith("Head 3.1 of 12 (dims 0–31")  # a model's head: L.H
    # at 100 (98 beside the scrollbar) all 16 keys fit, as the command line fits them
    from mha_trace.explorer.panes import matrix

    labels, rows, gap = matrix(app.session.view(), 0, 98)
    assert len(labels) == 17 and sum(max(len(str(l)), *(len(r[j].plain) for r in rows)) + 2 - (gap == 0)
                                     for j, l in enumerate(labels)) <= 98


def test_a_bug_in_a_pane_is_a_notice_and_the_explorer_goes_on(monkeypatch):
    from mha_trace.explorer.app import Explorer

    monkeypatch.setattr(Explorer, "draw_split", lambda self: 1 / 0)
    said = []
    monkeypatch.setattr(Explorer, "notify", lambda self, message, **kw: said.append(
        (message, kw.get("severity"))))

    async def body(app, pilot):
        await pilot.press("4", "1", "down")  # the split pane fails to draw; trace still moves
        await pilot.pause()
        return app.query_one("#steps").cursor_row

    assert with_app(body)[1] == 1
    assert said == [("internal error: ZeroDivisionError: division by zero (explore --debug shows "
                     "the traceback)", "error")]


@pytest.mark.parametrize("raised,said,code", [
    (MhaError("the model package is not installed"), "the model package is not installed", 2),
    (MemoryError("out of memory"), "explore could not open the run: MemoryError: out of memory", 1),
])
def test_a_failure_opening_the_session_ends_the_app_with_one_error(raised, said, code):
    def broken():
        raise raised

    async def body(app, pilot):
        await pilot.pause(0.2)

    app, _ = with_app(body, broken)
    assert isinstance(app.failure, MhaError)
    assert str(app.failure) == said and app.failure.exit_code == code


# a few screens as snapshots of their text and of which cells share a background
@pytest.mark.parametrize("name,options,keys", [
    ("trace", {}, ["down"] * 13),
    ("heads-causal", {"pane": "heads", "mask": "causal"}, ["]"]),
    ("split-light", {"pane": "split", "theme": "light"}, ["plus"]),
])
def test_screens_match_their_snapshots(golden, name, options, keys):
    app = drive(keys, snapshot=True, **options)
    golden(f"explore/{name}.txt", app.shown)


# the real thing in a pseudo-terminal
def _in_pty(args, keys, marker, size=(24, 80), timeout=60, env=None):
    import fcntl
    import termios

    pid, fd = pty.fork()
    if pid == 0:
        os.environ["TERM"] = "xterm-256color"
        os.environ.pop("NO_COLOR", None)
        os.environ.update(env or {})
        os.execvp(args[0], args)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", *size, 0, 0))
    start, out, pending = time.time(), b"", None  # pending: the keys still to press
    heard, sent_at, sent_len = start, start, -1  # last output; the last key, and output then
    while time.time() - start < timeout:
        ready, _, _ = select.select([fd], [], [], 0.02)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            out, heard = out + chunk, time.time()
        if pending is None and marker in out:
            pending = list(keys)
        now = time.time()
        settled = len(out) > sent_len and now - heard > 0.05 or now - sent_at > 0.5
        if pending and settled:  # the screen answered the last key (or had time to): the next
            os.write(fd, pending.pop(0))
            sent_at, sent_len = now, len(out)
    done, status = os.waitpid(pid, os.WNOHANG)
    if done == 0:  # still running: the marker never came
        os.kill(pid, 9)
        _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), ANSI.sub("", out.decode("utf-8", "replace"))


@pytest.mark.slow
def test_explore_in_a_real_terminal_with_stderr_hidden():
    """Keys work in a real terminal; and Textual draws on stderr, so `explore 2>/dev/null` once
    showed a blank screen: it draws on the terminal itself."""
    code, screen = _in_pty(["sh", "-c", "exec mha-trace explore 2>/dev/null"],
                           [b"2", b"m", b"+", b"q"], b"self.W_q")
    assert code == 0
    assert "self.W_q(q)" in screen and "H=4" in screen and "mask=causal" in screen


def test_explore_needs_a_terminal(cli):
    result = cli("explore")
    assert result.exit_code == 2
    assert result.stderr == ("Error: explore is interactive and needs a terminal; in scripts use "
                             "shapes, heads or explain (with --step for a paced demo)\n")


@pytest.mark.slow
def test_other_commands_never_import_textual():
    code = ("import sys; from typer.testing import CliRunner; from mha_trace.cli import app; "
            "[CliRunner().invoke(app, a) for a in (['shapes'], ['heads'], ['explain', '--step'])]; "
            "print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"


# --step
@pytest.mark.slow
def test_step_reveals_the_shapes_table_a_row_per_key_and_repeats_its_header():
    """In a real terminal --step shows a row a key; q shows the rest at once. On a 12-line terminal
    the table's header scrolls away after a few rows, so --step prints it again above the next
    row, and every column stays named."""
    code, screen = _in_pty(["mha-trace", "shapes", "--seq", "3", "--d-model", "8", "--heads", "2",
                            "--step"], [b" "] * 14 + [b"q"], b"--step: any key", size=(12, 100),
                           env={"LINES": "12", "COLUMNS": "100"})
    assert code == 0
    prompts = screen.count("(--step: any key for more, q for the rest)")
    assert prompts == 15  # the header, then rows 0 to 13 before q showed the rest
    assert re.search(r"18  \d+  self\.W_o\(context\)", screen)  # q printed the rest at once
    headers = screen.count("ln  code   ")
    assert headers >= 2, screen  # the first, and again once ten rows had gone by


def test_step_is_a_no_op_when_piped(cli):
    plain, stepped = cli("explain", "--token", "cat"), cli("explain", "--token", "cat", "--step")
    assert stepped.stdout == plain.stdout and "--step" not in stepped.stdout
    assert plain.stdout.count("\n") > 10


def test_a_config_too_long_to_read_live_is_refused(tmp_path):
    config = tmp_path / "long.toml"
    config.write_text('title = "long"\nsentence = "' + "word " * 70 + '"\nd_model = 8\nheads = 2\n')
    with pytest.raises(MhaError) as e:
        prepare(config=str(config))
    assert str(e.value) == ("config: explore shows every token live: at most 64 (this config has 70; "
                            "heads --config shows longer ones)")  # as Python shows it: naming the parameter


def test_the_split_pane_draws_at_most_48_maps():
    app = drive([], d_model=64, heads=64, seq=4, pane="split")
    text = re.sub(r"\s+", " ", app.texts["maps"])
    assert "head 48: dim 47" in text and "head 49:" not in text
    assert "Heads 49-64 are not drawn here (the heads pane shows any of them: [ ] pick)." in text


def test_a_trained_run_steps_through_its_saved_steps(tmp_path):
    """, and . move between a run's snapshots: the heads pane shows that step's weights."""
    import torch

    from mha_trace.models import checkpoints, training

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    run = training.run_training(training.Spec.of("previous-token", steps=30, snapshots=4))
    torch.set_num_threads(before)
    path = tmp_path / "run.pt"
    checkpoints.save(run, str(path))
    steps = [s.step for s in run.snapshots]
    app = drive(["comma", "comma"], model=f"{path}@{steps[-1]}", pane="heads")
    assert app.session.model.step == steps[-3] and app.sub_title == f"run.pt at step {steps[-3]}"
    w = run.snapshots[-3].weights[0, 0]  # head 1.1 on the probe at that step
    assert _cell(app, 0, 0) == fmt(w[0, 0], 2) + ("*" if w[0].argmax() == 0 else "")
    assert "training step" in app.texts["keys"]
    back = drive(["full_stop"] * 9, model=f"{path}@{steps[0]}")  # past the last: stays there
    assert back.session.model.step == steps[-1]


@pytest.mark.slow
def test_every_pane_draws_in_a_fresh_process():
    """Each pane's records are shown by renderers the explorer imports itself (a pane that relied
    on another test having imported one once failed on stage: 'no renderer is registered')."""
    code = ("from mha_trace.explorer.session import prepare; from mha_trace.explorer import panes as p; "
            "from rich.console import Console; s = prepare()(); s.off = {1}; c = Console(width=100); "
            "[c.print(x) for x in (p.walk_pane(s), p.split(s, 100), p.ablation(s), p.heads_title(s, s.view()), "
            "*p.step(s, s.report().steps[3], False))]")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "the query 'The' (position 0) through head 1" in out.stdout
    assert "output without head 1 (zeroed before W_O)" in out.stdout


def test_a_models_special_tokens_are_labels_not_markup():
    """[CLS] and [SEP] (and code like w[h]) are shown as they are: Textual would read them as
    markup and print '' looks at ''. The row labels stay when the table scrolls right."""
    app = drive(["2"], model="minilm")
    assert app.texts["cell"].startswith("'[CLS]' looks at '[CLS]': ")
    assert app.labels[1] == "[CL…" and app.labels[-1] == "[SE…"  # shortened to fit, as the CLI's
    assert app.row_labels[0] == "[CLS]" and app.fixed == 1
