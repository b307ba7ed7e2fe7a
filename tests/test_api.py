"""The Python API as the README shows it: results that render themselves in a terminal and in
Jupyter, and numbers equal to the CLI's."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import mha_trace

EXAMPLES = sorted(Path("examples").glob("*.py"))


@pytest.mark.slow
def test_import_is_light():
    code = "import sys, mha_trace; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False"


def test_trace_any_module_renders_as_text_html_and_json():
    mha = torch.nn.MultiheadAttention(64, 4, batch_first=True)
    x = torch.randn(2, 10, 64)
    t = mha_trace.trace(mha, x, x, x)
    assert (t.steps[0].shape, t.steps[0].op) == ((2, 10, 64), "input")
    text = str(t)
    assert text.startswith("shapes: MultiheadAttention, forward(query, key, value): batch=2 seq=10 d_model=64")
    assert "multi_head_attention_forward" in text
    html = t._repr_html_()
    assert html.startswith("<div") and "<table" in html and "<pre" not in html
    tables = re.sub(r"<iframe .*?</iframe>", "", html, flags=re.S)  # the page's CSS has --vars
    assert "multi_head_attention_forward" in tables and "--" not in tables
    assert html.index("<iframe") < html.index("<table")  # the interactive trace, then the table
    data = json.loads(t.to_json())
    assert data["schema_version"] == 2 and data["steps"][0]["shape"] == [2, 10, 64]


def test_shapes_equals_the_command(cli):
    api = mha_trace.trace_sizes(d_model=64, heads=4, mask="causal").data()
    command = json.loads(cli("shapes", "--d-model", "64", "--heads", "4", "--mask", "causal",
                             "--format", "json").stdout)
    assert {"schema_version": 2, **api} == command


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_trace_runs_every_example(path):
    from mha_trace.runs.run import Sizes, from_module

    name = "CausalSelfAttention" if path.name == "nanogpt_attention.py" else "MultiHeadAttention"
    run = from_module(f"{path}:{name}", Sizes(batch=1, seq=5, d_model=64, heads=4))
    if path.name == "chapter_numpy_mha.py":  # unbatched NumPy arrays, traced array op by op
        t = mha_trace.trace(run.module, *run.args)
        assert t.failure is None and t.steps[0].shape == (5, 64) and t.steps[-1].op == "hstack"
        return
    if path.name == "broken_view.py":
        assert mha_trace.trace(run.module, *run.args, **run.kwargs).failure.op == "view"
        return
    t = mha_trace.trace(run.module, *run.args, **run.kwargs)
    assert t.failure is None and t.steps[0].shape == (1, 5, 64)
    assert any(s.op in ("softmax", "scaled_dot_product_attention") for s in t.steps)


def test_heads_and_explain_give_the_chapters_numbers():
    h = mha_trace.heads("cat-sat-on-mat")
    assert h.weights.shape == (2, 5, 5)
    assert round(float(h.weights[0, 1, 0]), 4) == 0.3664
    w = mha_trace.explain(h, token="cat")
    assert w.heads[0].terms[0].dot == 2.0
    np.testing.assert_allclose([t.weight for t in w.heads[0].terms], h.weights[0, 1], atol=1e-12)
    assert "Head 1: dims 0–1" in str(w)


def test_explain_and_compare_and_ablate_match_the_cli(cli):
    for api, args in [(mha_trace.explain(token="cat"), ("explain", "--token", "cat")),
                      (mha_trace.compare(head_counts=(1, 2, 4)), ("compare", "--heads", "1,2,4")),
                      (mha_trace.ablate("chicken-road", removed=(3,)),
                       ("ablate", "--config", "chicken-road", "--head", "3"))]:
        assert {"schema_version": 2, **api.data()} == json.loads(cli(*args, "--format", "json").stdout)


def test_heads_takes_overrides_and_config_objects():
    from mha_trace.runs.config import load_config

    assert mha_trace.heads(load_config("chicken-road"), heads=2).weights.shape == (2, 11, 11)
    with pytest.raises(mha_trace.errors.MhaError, match="heads=3"):
        mha_trace.heads("cat-sat-on-mat", heads=3)


def test_a_students_verdict_prints_as_the_terminal_and_renders_once_in_a_notebook(cli):
    """print(r) is the verdict the command prints; Jupyter gets the same as a short HTML table,
    never a dump of the record's fields."""
    import mha_trace

    spec = "tests/student/student_bugs.py:ScaledByDk"
    r = mha_trace.verify(spec, d_model=32, heads=4)
    shown = cli("verify", "--module", spec, "--d-model", "32", "--heads", "4", "--width", "100")
    assert str(r) == shown.stdout and "Diagnosis: scaled by d_k instead of √d_k." in str(r)
    html = r._repr_html_()
    assert len(html) < 20_000 and "scaled by d_k instead of" in html and "<table" in html
    assert r.data()["passed"] is False and r.data()["diagnosis"] == "scaled by d_k instead of √d_k"


@pytest.mark.slow
def test_the_api_leaves_the_callers_process_as_it_was():
    """In a fresh process (where the command line never ran), as a script or a notebook calls it:
    verify runs the student's code, and afterwards the script's own print() still reaches stdout;
    the command line may set one thread for its own process, but a library call leaves torch's
    setting as the user left it (a notebook that chose 2 threads)."""
    code = ("import torch, mha_trace\ntorch.set_num_threads(2)\n"
            "r = mha_trace.verify('examples/chapter_torch_mha.py:MultiHeadAttention', d_model=32, heads=4)\n"
            "print('mine', r.passed)\n"
            "mha_trace.model('minilm').heads(layer=1)\nprint('threads', torch.get_num_threads())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[-2:] == ["mine True", "threads 2"]


@pytest.mark.parametrize("call,quantity", [
    (lambda m: m.cache(policies=None), "policy"),
    (lambda m: m.cache(policies=5), "policy"),
    (lambda m: m.cache(budgets=1e3), "budget"),
    (lambda m: m.explain(position=1.5), "position"),
    (lambda m: m.explain(by_head=True), "by_head"),
    (lambda m: mha_trace.model(m.name, max_tokens=0), "max_tokens"),
    (lambda m: mha_trace.model(m.name, max_tokens=-5), "max_tokens"),
    (lambda m: mha_trace.verify("example:l04", map=["q=W_q"]), "map"),
    (lambda m: mha_trace.verify("example:l04", mask_means=["keep"]), "mask-means"),
    (lambda m: mha_trace.train(["induction"]), "task"),
    (lambda m: mha_trace.trace(3, 4), "module"),
    (lambda m: m.heads(layer="2"), "layer"),
    (lambda m: m.survey(sentences=5), "sentences"),
    (lambda m: m.survey(targets=[1]), "targets"),
    (lambda m: m.ablate(removed=3), "removed"),
    (lambda m: m.patch(metric=3), "metric"),
    (lambda m: m.patch(by_position=3), "by_position"),
])
def test_the_apis_wrong_values_are_one_mhaerror_naming_the_quantity(default_run, call, quantity):
    """What the command line's parser refuses, the API refuses too: never a raw TypeError or
    IndexError from deep inside, never a by_head that silently runs why; and the message a
    notebook shows names the parameter, as the command line's names its option."""
    m = mha_trace.model(str(default_run))
    with pytest.raises(mha_trace.MhaError) as refused:
        call(m)
    assert refused.value.quantity == quantity
    shown = str(refused.value)
    assert shown.startswith((quantity, f"--{quantity.replace('_', '-')}")) or \
        f"--{quantity.replace('_', '-')}" in shown, shown


def test_device_none_is_the_default_device(default_run):
    assert mha_trace.model(str(default_run), device=None).device == "cpu"
