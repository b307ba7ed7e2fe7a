"""The Python API in a real Jupyter kernel (nbclient): each result shows once, as HTML tables
(below the interactive view, for heads and walks), with the numbers the chapter's formula gives,
and every sentence the terminal shows."""

import html
import re

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

from mha_trace.runs.config import load_config

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

MINE = """import math, torch, torch.nn as nn
class Mine(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (nn.Linear(d_model, d_model) for _ in range(4))
    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (W(x).view(B, T, self.h, self.d_k).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))
        w = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k)).softmax(-1)
        return self.W_o((w @ v).transpose(1, 2).reshape(B, T, -1)), w"""
CELLS = [
    'import mha_trace\nmha_trace.heads("cat-sat-on-mat")',
    'mha_trace.explain("cat-sat-on-mat", token="cat", head=1)',
    'm = mha_trace.model("minilm")\nm.heads(head="1.3")',
    'm.heads()',
    'mha_trace.cost(preset="gpt3-175b", dtype="float16")',
    'try:\n    mha_trace.heads(mask="diagonal")\nexcept mha_trace.MhaError as e:\n'
    '    print(e.quantity, "|", e)',
    'r = mha_trace.trace_sizes(d_model=16, heads=4)\nr.largest.shape',
    'mha_trace.train("previous-token", steps=20, snapshots=2)',
    'mha_trace.explain("cat-sat-on-mat", token="cat", head=1, effect=True, why=True)',
    'm.explain(token="it", head="3.1", why=True)',
    'm.heads(head="3.1", effect=True)',
    'mha_trace.model(RUN).composition()',  # a decoder's composition: the trained run's
    MINE,  # a class of the student's own, defined in a cell (its module has no file)
    'print([(s.line, s.source, s.op) for s in mha_trace.trace(Mine(32, 4), torch.randn(2, 5, 32)).steps][2])',
    'r = mha_trace.verify(Mine, d_model=32, heads=4)\nprint(r.passed, r.data()["diagnosis"])',
    'def attend(q, k, v):\n    return (q @ k.transpose(-2, -1) / 2).softmax(-1) @ v\n'
    't = mha_trace.trace(attend, *[torch.randn(1, 2, 3, 4)] * 3)\n'
    'print(t.run.label, t.run.call, [(s.line, s.op) for s in t.steps])',
]


@pytest.fixture(scope="module")
def outputs(default_run):
    cells = [f"RUN = {str(default_run)!r}", *CELLS]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=300, kernel_name="python3").execute()
    return [cell.outputs for cell in nb.cells[1:]]


def cells_of(fragment: str) -> list[list[str]]:
    """The text of each <td> of each <tr> in an HTML fragment."""
    rows = re.findall(r"<tr>(.*?)</tr>", fragment, re.S)
    return [[html.unescape(re.sub(r"<[^>]+>", "", td)).strip()
             for td in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)] for row in rows]


def by_hand(config: str) -> np.ndarray:
    """The chapter's formula written out: softmax(Q_h K_hᵀ / √d_k) per head, (H, T, T)."""
    c = load_config(config)
    Q, K = np.array(c.Q), np.array(c.K)
    out = []
    for h in range(c.heads):
        cols = slice(h * c.d_k, (h + 1) * c.d_k)
        s = Q[:, cols] @ K[:, cols].T / np.sqrt(c.d_k)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out.append(e / e.sum(axis=1, keepdims=True))
    return np.array(out)


def test_every_result_shows_once_as_one_execute_result(outputs):
    for i in (0, 1, 2, 3, 4):
        assert [o.output_type for o in outputs[i]] == ["execute_result"], CELLS[i]
        data = outputs[i][0].data
        assert set(data) == {"text/html", "text/plain"}
        assert data["text/html"].startswith('<div class="mha-trace"')


def test_heads_and_walks_show_the_interactive_view_above_their_tables(outputs):
    for i in (0, 1, 2, 3):
        page = outputs[i][0].data["text/html"]
        frame = page.index('<iframe class="mha-trace" sandbox="allow-scripts"')
        assert frame < page.index("<table") if "<table" in page else frame
        assert "&lt;script&gt;" in page and "<script" not in page  # the page is srcdoc, escaped
    assert "iframe" not in outputs[4][0].data["text/html"]  # cost: tables only


def test_the_heads_tables_are_real_tables_with_the_chapters_numbers(outputs):
    page = outputs[0][0].data["text/html"]
    assert page.count("<table") >= 2 and "<pre" not in page
    rows = [r for r in cells_of(page) if r and r[0] in load_config().tokens]
    expected = by_hand("cat-sat-on-mat")
    for h in range(2):  # the first two tables are head 1's and head 2's weights
        shown = np.array([[float(c.rstrip("*")) for c in r[1:]] for r in rows[5 * h:5 * h + 5]])
        np.testing.assert_allclose(shown, expected[h], atol=5e-5)
    assert outputs[0][0].data["text/plain"].startswith("The cat sat on mat")


def test_explain_shows_only_the_head_asked_for(outputs):
    page = outputs[1][0].data["text/html"]
    assert "Head 1:" in page and "Head 2:" not in page
    w = by_hand("cat-sat-on-mat")[0][1]  # head 1, the query 'cat'
    softmax = [r[-1] for r in cells_of(page) if len(r) >= 4][:5]
    np.testing.assert_allclose([float(x.rstrip("*")) for x in softmax], w, atol=5e-5)


def test_a_model_head_is_one_whole_table(outputs):
    page = outputs[2][0].data["text/html"]
    assert "keys 1–10" not in page  # the notebook has no width: never split
    rows = [r for r in cells_of(page) if len(r) == 17]  # the label and 16 keys
    assert len(rows) == 16
    # head 1.3 is a previous-token head: each query's largest weight is on the token before it
    assert all(r[i].endswith("*") for i, r in enumerate(rows[1:], start=1))


def test_the_overview_is_its_interactive_view_without_braille(outputs):
    """A model's overview as text is a braille grid that HTML cannot line up: the notebook shows
    the interactive view alone."""
    page = outputs[3][0].data["text/html"]
    assert "<iframe" in page and not re.search("[\u2801-\u28ff]", page)


def test_training_shows_its_progress_then_its_tables_and_figure(outputs):
    """A bar while it trains (one display, updated in place), then the run: its tables and the
    slide of its loss and head scores as an image."""
    shown = outputs[7]
    bar = [o for o in shown if o.output_type == "display_data"]
    assert len(bar) == 1 and "<progress" in bar[0].data["text/html"]
    final = [o for o in shown if o.output_type == "execute_result"]
    assert len(final) == 1
    page = final[0].data["text/html"]
    assert "Snapshots" in page and '<img alt="the loss and each head' in page
    assert 'src="data:image/png;base64,' in page


def test_errors_name_the_quantity_and_numbers_come_back(outputs):
    assert outputs[5][0].text == "mask | mask 'diagonal' is not one of none, causal\n"
    assert outputs[6][0].data["text/plain"] == "(2, 4, 10, 10)"  # B, H, T, T: 800 > 2·10·16
    assert "Parameters" in outputs[4][0].data["text/html"]


def test_effect_and_why_show_in_the_notebook_as_on_the_terminal(outputs):
    """The chapter's 'cat' in head 1: the walk with its effect column, then its score split into
    dims (without dim 1 every key gets 0.2); a model's split has its sources; MiniLM's head 3.1
    has its effect table."""
    walk = outputs[8][0].data["text/html"]
    rows = cells_of(walk)
    assert ["sat", "0.0×1.0 + 2.0×1.0 = 2.0000", "1.4142", "0.3664", "0.0000", "0.0000"] in rows
    assert ["without dim 1", "0.2000", "0.2000", "0.2000", "0.2000", "0.2000"] in rows
    model = outputs[9][0].data["text/html"]
    assert "without position" in model and "largest parts" in model
    assert "Head 3.1: effect" in outputs[10][0].data["text/html"]


def _prose(fragment: str) -> str:
    """An HTML fragment's paragraphs as one string of words."""
    paragraphs = re.findall(r"<p[^>]*>(.*?)</p>", re.sub(r"<iframe .*?</iframe>", "", fragment, flags=re.S), re.S)
    return " ".join(" ".join(html.unescape(re.sub(r"<[^>]+>", "", p)).split()) for p in paragraphs)


def test_the_notebook_shows_every_sentence_the_terminal_shows(outputs):
    """The title that names its command, the sources of --why, a sentence that points at a flag:
    nothing is cut out of the notebook's prose (it once dropped every line naming a flag, and
    with it the rest of a sentence)."""
    why = _prose(outputs[9][0].data["text/html"])
    plain = " ".join(outputs[9][0].data["text/plain"].split())
    assert "Sources:" in why and "Sources:" in plain
    composition = _prose(outputs[11][-1].data["text/html"])  # after its progress bar
    assert "survey --composition: run.pt at step 600, 2 layers × 4 heads" in composition
    assert "--format json has every pair." in composition


def test_a_class_and_a_function_defined_in_cells_are_traced_and_verified(outputs):
    """What a student writes in a notebook: the class's module (the kernel's __main__) has no
    file, and its lines are the cell's (they failed with 'source code not available'); a plain
    function is traced as well, its per-head inputs read as (batch, heads, seq, d_k)."""
    assert outputs[13][0].text.strip() == "(9, 'q, k, v = (W(x).view(B, T, self.h, self.d_k)" \
        ".transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))', 'view')"
    assert outputs[14][0].text == "True None\n"
    assert outputs[15][0].text == "attend attend(q, k, v) [(0, 'input'), (2, 'transpose'), " \
        "(2, 'matmul'), (2, 'div'), (2, 'softmax'), (2, 'matmul')]\n"
