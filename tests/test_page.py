"""The interactive page (`--html`, and a notebook's view) in a real browser: Debian's Chromium driven
by Playwright for Python (`executable_path`: no browser is downloaded). Each test opens a page the
CLI wrote, clicks and hovers it, and checks the DOM against the records the CLI prints from; no
request may leave the page and no script error may happen. Two screenshots are kept as goldens.
"""

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from browsers import installed_at, paged_in
import mha_trace

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

CHROMIUM = os.environ.get("MHA_TRACE_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
GOLDEN = Path(__file__).parent / "golden" / "page"


@pytest.fixture(scope="module")
def browser():
    import playwright
    from playwright.sync_api import sync_playwright

    paged_in(installed_at(CHROMIUM), Path(playwright.__file__).parent / "driver")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


OPEN = []  # the pages this test opened


@pytest.fixture(autouse=True)
def each_page_closed():
    """Each page a test opens is closed as it ends, its renderer process with it: left open,
    the module's pages ran side by side to its end (3.3 s more of the module's 26 s)."""
    yield
    for page in OPEN:
        page.context.close()
    OPEN.clear()


class Opened:
    """A page of the browser, with every request it made and every error it raised."""

    def __init__(self, browser, url: str, dark: bool = False):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900},
                                     color_scheme="dark" if dark else "light")
        OPEN.append(self.page)
        self.requests, self.errors = [], []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("dialog", lambda d: (self.errors.append(f"dialog: {d.message}"), d.dismiss()))
        self.url = url
        self.page.goto(url)

    def clean(self) -> bool:
        """Nothing but the file itself was requested, and nothing went wrong."""
        assert self.requests == [self.url], self.requests
        assert self.errors == [], self.errors
        return True

    def line_weights(self) -> dict:
        """(head, query, key) -> the weight each drawn line's tooltip shows."""
        found = {}
        for a in self.page.eval_on_selector_all(
                "#head-view line", "ls => ls.map(l => [l.dataset.head, l.dataset.q, l.dataset.k, "
                "l.querySelector('title').textContent])"):
            found[(int(a[0]), int(a[1]), int(a[2]))] = float(a[3].rsplit(" ", 1)[1])
        return found


def _written(cli, tmp_path, *args) -> str:
    out = tmp_path / "page.html"
    result = cli(*args, "--html", str(out))
    assert result.exit_code == 0, result.stderr
    return out.as_uri()


def test_head_view_of_the_chapters_example(cli, tmp_path, browser):
    view = mha_trace.heads("cat-sat-on-mat")
    p = Opened(browser, _written(cli, tmp_path, "heads"))
    page = p.page
    assert page.title() == "The cat sat on mat"
    assert page.locator("button.head").count() == 2 and page.locator("#model-view button").count() == 2
    lines = p.line_weights()  # every head, every pair over 0.01
    for (h, q, k), shown in lines.items():
        assert shown == pytest.approx(view.weights[h - 1, q, k], abs=6e-5)
    assert len(lines) == int((view.weights >= 0.01).sum())
    page.hover("text.q[data-index='1']")  # 'cat' as the query: only its lines
    assert {q for _, q, _ in p.line_weights()} == {1}
    readout = page.text_content("#readout")
    best = view.weights[0, 1].max()
    assert readout.startswith("cat attends most to: head 1: → ") and f"{best:.4f}" in readout
    page.click("button.head[data-head='2']")  # head 2 off
    assert page.get_attribute("button.head[data-head='2']", "aria-pressed") == "false"
    assert {h for h, _, _ in p.line_weights()} == {1}
    page.click("text.k[data-index='4']")  # a key clicked: what attends to 'mat'
    assert {k for _, _, k in p.line_weights()} == {4}
    assert p.clean()


def test_model_view_tiles_open_their_head(cli, tmp_path, browser):
    s = mha_trace.model("minilm").run().sentence
    url = _written(cli, tmp_path, "heads", "--model", "minilm")
    assert Path(url.removeprefix("file://")).stat().st_size < 2_000_000
    p = Opened(browser, url)
    page = p.page
    assert page.locator("#model-view button.tile").count() == 72
    page.click("#model-view button[data-layer='6'][data-head='12']")
    assert page.input_value("#layer") == "5"  # the sixth layer
    pressed = page.eval_on_selector_all("button.head", "bs => bs.map(b => b.getAttribute('aria-pressed'))")
    assert pressed == ["false"] * 11 + ["true"]
    lines = p.line_weights()
    assert lines and {h for h, _, _ in lines} == {12}
    for (h, q, k), shown in lines.items():
        assert shown == pytest.approx(s.weights[5, 11, q, k], abs=6e-5)
    page.keyboard.press("ArrowLeft")  # the layer before
    assert page.input_value("#layer") == "4"
    page.keyboard.press("t")
    assert page.get_attribute("html", "data-theme") == "dark"
    assert p.clean()


def test_one_layer_of_a_long_smollm2_sentence_stays_under_two_megabytes(cli, tmp_path, browser):
    text = " ".join(["The cat sat on the mat and looked at the dog."] * 21)  # 252 tokens
    url = _written(cli, tmp_path, "heads", "--model", "smollm2", "--sentence", text, "--layer", "3")
    size = Path(url.removeprefix("file://")).stat().st_size
    assert 1_000_000 < size < 2_000_000
    p = Opened(browser, url)
    assert p.page.locator("button.head").count() == 9 and p.page.locator("text.q").count() == 252
    assert p.clean()
    whole = cli("heads", "--model", "smollm2", "--sentence", text, "--html", str(tmp_path / "w.html"))
    assert whole.exit_code == 2 and whole.stderr.startswith("Error: --html: the page would hold")
    assert "show one layer with --layer N" in whole.stderr and not (tmp_path / "w.html").exists()


def test_tokens_are_text_never_markup(cli, tmp_path, browser):
    config = tmp_path / "evil.toml"
    config.write_text('title = "</script><script>alert(1)</script>"\n'
                      'tokens = ["<script>alert(2)</script>", "</script>", "<b>x</b>", "&amp;"]\n'
                      'heads = 1\nd_model = 4\nseed = 1\n')
    p = Opened(browser, _written(cli, tmp_path, "heads", "--config", str(config)))
    shown = p.page.eval_on_selector_all("text.q", "ts => ts.map(t => t.textContent)")
    assert shown == ["<script>alert(2)</script>", "</script>", "<b>x</b>", "&amp;"]
    assert p.page.text_content("h1") == "</script><script>alert(1)</script>"
    assert p.page.locator("b").count() == 0 and p.clean()  # no dialog, no element from a token


def test_explain_walk_shows_every_product(cli, tmp_path, browser):
    w = mha_trace.explain("cat-sat-on-mat", token="cat")
    p = Opened(browser, _written(cli, tmp_path, "explain", "--token", "cat"))
    page = p.page
    assert page.locator("details.head").count() == 2
    assert page.get_attribute("details.head[data-head='1']", "open") == ""
    weights = page.eval_on_selector_all("details[data-head='1'] td.weight", "ts => ts.map(t => +t.textContent)")
    np.testing.assert_allclose(weights, [t.weight for t in w.heads[0].terms], atol=5e-5)
    products = page.locator("details[data-head='1'] tr.products").first
    assert products.is_hidden()
    page.click("details[data-head='1'] tr.term >> nth=0")
    assert products.is_visible()
    first = w.heads[0].terms[0]
    assert products.text_content().endswith(f"= {first.dot:.4f}")
    assert products.text_content().count("×") == len(first.products)
    page.click("details[data-head='2'] summary")
    assert page.get_attribute("details.head[data-head='2']", "open") == ""
    assert p.clean()


def test_the_tiled_page_steps_through_the_tiles(cli, tmp_path, browser):
    """explain --impl tiled --html: n and p step a tile at a time; each head's readout says that
    tile's running max, rescale and sum, as the JSON has them, and the last one the row's output."""
    import json

    t = json.loads(cli("explain", "--token", "sat", "--impl", "tiled", "--block-k", "2", "--format", "json").stdout)
    p = Opened(browser, _written(cli, tmp_path, "explain", "--token", "sat", "--impl", "tiled", "--block-k", "2"))
    page = p.page
    readout = lambda head: page.text_content(f"p.readout[data-head='{head}']")
    assert page.text_content("#tile-step") == "tile 1 of 3" and page.is_disabled("#tile-back")
    for step in range(3):
        for head in t["heads"]:
            tile = head["tiles"][step]
            assert f"= {tile['m_new']:.4f}\n" in readout(head["head"])
            assert f"+ Σ p = {tile['l_new']:.4f}" in readout(head["head"])
            rows = page.eval_on_selector_all(f"details[data-head='{head['head']}'] tr[data-tile]",
                                             "rs => rs.map(r => [+r.dataset.tile, r.className])")
            assert all(("sel" in cls) == (tile_no == step + 1) for tile_no, cls in rows)
        if step < 2:
            page.keyboard.press("n")
    assert page.text_content("#tile-step") == "tile 3 of 3" and page.is_disabled("#tile-next")
    out = t["heads"][0]["output"]
    assert f"output o ÷ ℓ = [{out[0]:.4f}, {out[1]:.4f}]" in readout(1)
    page.keyboard.press("p")
    assert page.text_content("#tile-step") == "tile 2 of 3"
    assert p.clean()


def test_the_effect_toggle_redraws_lines_readout_and_tiles(cli, tmp_path, browser):
    """--effect: "e" (or the button) switches every line and tile from the weights to the effect
    weights, checked against transformers' (tests/fixtures/effect_reference.npz)."""
    import json

    reference = np.load(Path(__file__).parent / "fixtures" / "effect_reference.npz")
    text = json.loads(str(reference["meta"]))["sentence"]
    s = mha_trace.model("minilm").run(text).sentence
    p = Opened(browser, _written(cli, tmp_path, "heads", "--model", "minilm", "--sentence", text,
                                 "--effect"))
    page = p.page
    page.click("#model-view button[data-layer='3'][data-head='1']")
    tile = "#model-view button[data-layer='3'][data-head='1'] canvas"
    before = page.eval_on_selector(tile, "c => c.toDataURL()")
    for (h, q, k), shown in p.line_weights().items():
        assert shown == pytest.approx(s.weights[2, h - 1, q, k], abs=6e-5)
    page.keyboard.press("e")
    assert page.get_attribute("#effect", "aria-pressed") == "true"
    lines = p.line_weights()
    assert lines
    for (h, q, k), shown in lines.items():
        assert shown == pytest.approx(reference["minilm_sentence_effect"][2, h - 1, q, k], abs=1e-4)
    assert page.eval_on_selector(tile, "c => c.toDataURL()") != before
    page.hover("text.q[data-index='1']")
    assert "(effect weights)" in page.text_content("#readout")
    page.click("#effect")
    assert page.get_attribute("#effect", "aria-pressed") == "false"
    assert page.eval_on_selector(tile, "c => c.toDataURL()") == before
    plain = Opened(browser, _written(cli, tmp_path, "heads", "--model", "minilm"))
    assert plain.page.locator("#effect").count() == 0  # no toggle without effect weights
    assert p.clean() and plain.clean()


def test_the_explain_page_shows_each_keys_effect(cli, tmp_path, browser):
    w = mha_trace.explain("chicken-road", token="it", effect=True)
    p = Opened(browser, _written(cli, tmp_path, "explain", "--config", "chicken-road", "--token",
                                 "it", "--effect"))
    shown = p.page.eval_on_selector_all("details[data-head='3'] td.effect", "ts => ts.map(t => +t.textContent)")
    np.testing.assert_allclose(shown, [t.effect for t in w.heads[2].terms], atol=5e-5)
    assert p.page.locator("details[data-head='3'] span.bar.effect").count() == len(shown)
    assert p.clean()


def test_the_explain_page_splits_a_hovered_score_by_source(cli, tmp_path, browser):
    text = "The animal didn't cross the street because it was too tired."
    w = mha_trace.model("minilm").explain(text, token="it", head="3.1", why=True)
    why = w.why[0]
    p = Opened(browser, _written(cli, tmp_path, "explain", "--model", "minilm", "--sentence", text,
                                 "--token", "it", "--head", "3.1", "--why"))
    page = p.page
    j = w.view.tokens.index("because")
    page.hover(f"details[data-head='1'] tr.term >> nth={j}")
    shown = page.text_content("details[data-head='1'] p.why")
    assert shown.startswith(f"because: score {why.score[j]:.4f} = ")
    biggest = int(np.argmax(np.abs(why.parts[:, j])))
    value = why.parts[biggest, j]
    assert f"{why.sources[biggest]} {'+' if value >= 0 else '−'}{abs(value):.3f}" in shown
    rows = page.eval_on_selector_all("details[data-head='1'] table.without tr[data-source]",
                                     "rs => rs.map(r => [r.dataset.source, [...r.querySelectorAll('td.num')].map(t => +t.textContent)])")
    assert len(rows) == 5
    for name, weights in rows:
        np.testing.assert_allclose(weights, why.without(why.sources.index(name)), atol=5e-5)
    assert p.clean()


def test_shapes_rows_light_their_source_line(cli, tmp_path, browser):
    report = mha_trace.trace_sizes()
    p = Opened(browser, _written(cli, tmp_path, "shapes"))
    page = p.page
    assert page.locator("table.steps tr[data-step]").count() == len(report.steps)
    softmax = next(i for i, s in enumerate(report.steps) if s.op == "softmax")
    page.click(f"tr[data-step='{softmax + 1}']")
    line = int(page.get_attribute(".source div.sel", "data-line"))
    assert line == report.steps[softmax].line
    assert "torch.softmax(scores, dim=-1)" in page.text_content(".source div.sel")
    page.keyboard.press("ArrowDown")
    assert int(page.get_attribute(".source div.sel", "data-line")) == report.steps[softmax + 1].line
    assert page.get_attribute(f"tr[data-step='{softmax + 2}']", "class") == "sel"
    assert p.clean()


def test_the_gradebook_page_shows_each_student_as_text(cli, tmp_path, browser):
    """A class's grades.html: a row per student with the JSON's verdict and mistake, the class's
    counts, and a student's file name that is markup shown as text, never run."""
    skeleton = (Path(__file__).parent / "classroom" / "skeleton.py").read_text()
    klass = tmp_path / "class"
    klass.mkdir()
    evil = "<img src=x onerror=alert(1)>"
    for name, text in (("alice", skeleton), ("bob", skeleton.replace("/ math.sqrt(D)", "/ D")), (evil, "x = (\n")):
        (klass / f"{name}.py").write_text(text)
    result = cli("verify", "--module", f"{klass}/*.py:MultiHeadAttention", "--course", "cs231n",
                 "--gradebook", str(tmp_path / "grades"), "--format", "json")
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    p = Opened(browser, (tmp_path / "grades" / "grades.html").as_uri())
    cells = p.page.eval_on_selector_all("tbody tr", "rs => rs.map(r => [...r.cells].map(c => c.textContent))")
    assert [(c[0], c[1].lower()) for c in cells] == [(r["student"], r["verdict"]) for r in data["students"]]
    assert evil in [c[0] for c in cells] and p.page.locator("img").count() == 0
    bob = next(c for c in cells if c[0] == "bob")
    assert bob[2].startswith("30") and bob[3] == "scaled by d_k instead of √d_k" and "math.sqrt(d_k)" in bob[4]
    assert "Scaled by d_k instead of √d_k: 1 of 3." in p.page.text_content("ul")
    assert p.clean()


def test_the_notebook_view_is_the_same_page_in_a_sandboxed_frame(browser, tmp_path):
    fragment = mha_trace.heads("cat-sat-on-mat")._repr_html_()
    assert fragment.startswith('<div class="mha-trace"')  # the view first, then the tables
    assert fragment.index('<iframe class="mha-trace" sandbox="allow-scripts"') < fragment.index("<table")
    f = tmp_path / "notebook.html"
    f.write_text(f"<!DOCTYPE html><html><body>{fragment}</body></html>")
    p = Opened(browser, f.as_uri())
    frame = p.page.frame_locator("iframe.mha-trace")
    assert frame.locator("button.head").count() == 2
    frame.locator("text.q[data-index='1']").hover()
    assert frame.locator("#readout").text_content().startswith("cat attends most to")
    assert p.errors == [] and all(u == p.url or u.startswith("about:") for u in p.requests)


@pytest.mark.parametrize("name, args", [("heads", ("heads",)), ("shapes", ("shapes",))])
def test_screenshots_match_their_goldens(cli, tmp_path, browser, request, name, args):
    from PIL import Image, ImageChops

    p = Opened(browser, _written(cli, tmp_path, *args))
    shot = tmp_path / f"{name}.png"
    p.page.screenshot(path=str(shot))
    golden = GOLDEN / f"{name}.png"
    if request.config.getoption("--update-golden"):
        golden.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, golden)
    a, b = Image.open(shot).convert("RGB"), Image.open(golden).convert("RGB")
    assert a.size == b.size == (1280, 900)
    differs = np.asarray(ImageChops.difference(a, b)).max(axis=2) > 48
    assert differs.mean() < 0.01, f"{differs.mean():.2%} of the pixels differ from {golden}"


FIREFOX = shutil.which("firefox-esr") or shutil.which("firefox") or "/usr/bin/firefox-esr"


FIREFOX_PAGES = [  # each page, and a colour that only its script draws
    (("heads",), (230, 25, 75)),  # head 1's lines
    (("explain", "--token", "cat"), (42, 111, 219)),  # the weight bars
    (("shapes",), (255, 243, 176)),  # the selected row and its source line
]


def test_firefox_draws_the_same_pages(cli, tmp_path):
    """Debian's Firefox, headless, takes a screenshot once the pages have loaded (one launch: the
    three pages stacked in frames of 1280×900): what only each page's script draws must be in
    its frame (Playwright drives Chromium alone here)."""
    import subprocess

    from PIL import Image

    frames = []
    for i, (args, _) in enumerate(FIREFOX_PAGES):
        folder = tmp_path / str(i)
        folder.mkdir()
        frames.append(f'<iframe src="{_written(cli, folder, *args)}" width="1280" height="900" '
                      f'style="display:block;border:0"></iframe>')
    stack = tmp_path / "stack.html"
    stack.write_text('<!doctype html><body style="margin:0">' + "".join(frames) + "</body>")
    profile, shot = tmp_path / "profile", tmp_path / "firefox.png"
    profile.mkdir()
    paged_in(installed_at(FIREFOX))
    subprocess.run([FIREFOX, "--headless", "--no-remote", "--profile", str(profile),
                    f"--window-size=1280,{900 * len(frames)}", "--screenshot", str(shot),
                    stack.as_uri()], capture_output=True, timeout=120, check=True)
    image = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    for i, (args, colour) in enumerate(FIREFOX_PAGES):
        pixels = image[900 * i:900 * (i + 1)].reshape(-1, 3)
        near = np.abs(pixels - np.array(colour)).sum(1) < 60
        assert near.sum() > 50, f"{args}: {near.sum()} pixels of {colour}"


def test_one_run_says_the_same_numbers_in_every_medium(cli, tmp_path, browser):
    """One convention (docs/output.md): positions and trace rows from 0, dims as a 0-based
    inclusive range, heads from 1, sizes in KiB from one function, a leading space as ␣. The
    terminal, the JSON and the page agree on each."""
    import json
    import re

    terminal = cli("explain", "--token", "cat").stdout
    data = json.loads(cli("explain", "--token", "cat", "--format", "json").stdout)
    page = Opened(browser, _written(cli, tmp_path, "explain", "--token", "cat")).page.inner_text("body")
    position = data["position"]
    assert f"(position {position})" in terminal and f"(position {position})" in page
    first, last = data["heads"][0]["dims"][0], data["heads"][0]["dims"][1] - 1
    assert f"dims {first}–{last}" in terminal and f"dims {first}–{last}" in page

    terminal = cli("shapes").stdout
    page = Opened(browser, _written(cli, tmp_path, "shapes")).page
    rows = page.eval_on_selector_all("table.steps tr", "rs => rs.slice(1).map(r => "
                                     "[...r.cells].map(c => c.textContent))")
    printed = [line.split() for line in terminal.splitlines() if re.match(r"^\s*\d+\s+(in|\d+)\s", line)]
    assert [r[0] for r in rows] == [p[0] for p in printed]  # the same row numbers, from 0
    assert [r[-1] for r in rows] == [p[-2] + " " + p[-1] if p[-1].endswith("B") else p[-1]
                                     for p in printed]  # the same allocation text: 6.2 KiB, view


def test_the_patching_page_shows_every_grid_with_the_numbers_of_the_json(browser, cli, default_run, tmp_path):
    """`patch --html`: the residual, head, query and K/V-group grids and one head by position, each
    cell the share JSON gives (two decimals), its readout the four-decimal share, the metric and
    attribution's estimate; a trained run's heads each have their own K/V (no sharing is claimed)."""
    args = ("patch", "--checkpoint", str(default_run), "--by-input", "--by-position", "2.3")
    data = json.loads(cli(*args, "--format", "json").stdout)
    out = tmp_path / "patch.html"
    assert cli(*args, "--html", str(out)).exit_code == 0
    opened = Opened(browser, out.as_uri())
    page = opened.page
    heads = np.array(data["heads"]["fraction"])
    cells = page.eval_on_selector_all("#patch-heads td", "cs => cs.map(c => c.textContent)")
    assert [float(x) for x in cells] == pytest.approx(np.round(heads, 2).ravel().tolist(), abs=1e-9)
    residual = np.array(data["residual"]["fraction"]).T  # positions down, layers across
    assert page.eval_on_selector_all("#patch-residual td", "cs => cs.length") == residual.size
    page.hover("#patch-heads td[data-row='1'][data-col='2']")
    said = page.inner_text("#patch-readout")
    attribution = data["heads"]["attribution"]["fraction"][1][2]
    assert said.startswith(f"head 2.3: restores {heads[1, 2]:.4f} of the gap (metric "
                           f"{data['heads']['metric'][1][2]:.4f}); attribution patching's estimate "
                           f"{attribution:.4f}"), said
    page.hover("#patch-kv td[data-row='1'][data-col='0']")
    assert page.inner_text("#patch-readout").startswith(
        f"layer 2, K/V group 1: restores {data['kv_groups']['fraction'][1][0]:.4f}")
    assert "serves" not in page.inner_text("body")  # four heads, four K/V groups: nothing shared
    positions = page.eval_on_selector_all("#patch-positions td", "cs => cs.map(c => c.textContent)")
    assert [float(x) for x in positions] == pytest.approx(np.round(data["by_position"]["fraction"], 2), abs=1e-9)
    assert opened.clean()


def test_the_path_patching_page_shows_each_input_as_the_json_does(browser, cli, default_run, tmp_path):
    """`patch --sender 1.1,1.2 --receiver 2.4 --html`: the four inputs, each with its metric and
    its share of the gap as JSON gives them."""
    args = ("patch", "--checkpoint", str(default_run), "--sender", "1.1,1.2", "--receiver", "2.4")
    via = json.loads(cli(*args, "--format", "json").stdout)["via"]
    out = tmp_path / "path.html"
    assert cli(*args, "--html", str(out)).exit_code == 0
    opened = Opened(browser, out.as_uri())
    rows = opened.page.eval_on_selector_all("#path-table tr[data-input]", "rs => rs.map(r => [r.dataset.input, "
                                            "r.cells[1].textContent, r.cells[2].textContent])")
    assert [r[0] for r in rows] == ["q", "k", "v", "qkv"]
    for key, metric, share in rows:
        assert float(metric) == pytest.approx(via[key]["metric"], abs=5e-5)
        assert float(share) == pytest.approx(round(via[key]["fraction"], 2), abs=1e-9)
    assert "1.1 + 1.2 reaches 2.4 only through the input named" in opened.page.inner_text("body")
    assert opened.clean()


def test_the_hearing_page_shows_where_each_token_listens_as_the_json_does(browser, cli, tmp_path):
    """`survey --model whisper --audio FILE --timestamps --html`: a row of the picture for each
    text token, its readout the JSON's alignment value at the hovered token and time (keys move it
    too), each word's timing, each head's disagreement with the published heads marked."""
    args = ("survey", "--model", "whisper", "--audio", "examples/audio/cat.wav", "--timestamps")
    data = json.loads(cli(*args, "--format", "json").stdout)
    out = tmp_path / "hear.html"
    assert cli(*args, "--html", str(out)).exit_code == 0
    opened = Opened(browser, out.as_uri())
    page = opened.page
    matrix = np.array(data["alignment"]["matrix"])
    T, F = len(data["tokens"]), matrix.shape[1]
    assert page.eval_on_selector_all(".hear-tokens div", "ds => ds.map(d => d.textContent)") == \
        [t.strip() for t in data["tokens"]]
    box = page.eval_on_selector("#hear-picture", "c => { const b = c.getBoundingClientRect(); "
                                "return [b.left, b.top, b.width, b.height]; }")
    t, f = 2, F // 3
    page.mouse.move(box[0] + (f + 0.5) * box[2] / F, box[1] + (t + 0.5) * box[3] / T)
    said = page.inner_text("#hear-readout")
    assert said.startswith(f"'{data['tokens'][t].strip()}' at {f / 50:.2f} s: {matrix[t, f]:.3f}"), said
    page.focus("#hear-picture")
    page.keyboard.press("ArrowDown")
    page.keyboard.press("ArrowRight")
    assert page.inner_text("#hear-readout").startswith(f"'{data['tokens'][t + 1].strip()}' at {(f + 1) / 50:.2f} s")
    words = page.eval_on_selector_all("#hear-words tr[tabindex]", "rs => rs.map(r => [r.cells[0].textContent, "
                                      "r.cells[1].textContent, r.cells[2].textContent])")
    assert words == [[w["word"], f"{w['start']:.2f}", f"{w['end']:.2f}"] for w in data["words"]]
    cells = page.eval_on_selector_all("#hear-heads td", "cs => cs.map(c => [c.dataset.head, c.textContent])")
    grid = np.array(data["heads"]["disagreement_seconds"])
    assert [float(text.rstrip("* ")) for _, text in cells] == pytest.approx(grid.ravel().tolist(), abs=6e-4)
    assert {head for head, text in cells if text.endswith("*")} == set(data["heads"]["published"])
    first = data["heads"]["found"][0]
    page.focus(f'#hear-heads td[data-head="{first}"]')
    l, h = (int(x) - 1 for x in first.split("."))
    lag = data["heads"]["lag_seconds"][l][h]
    assert f"{abs(lag):.2f} s {'before' if lag < 0 else 'after'} the 12 that disagree least" in \
        page.inner_text("#hear-readout")
    assert "among the 8 ranked first" in page.inner_text("#hear-readout")
    assert opened.clean()
