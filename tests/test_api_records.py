"""Every result the Python API returns is a record that shows itself: print(r) gives the
terminal's text (never a dataclass dump), Jupyter gets one HTML block, r.data() is the JSON of
--format json. One call of each API function and model method."""

import json

import pytest

import mha_trace
from mha_trace.records import Shows

CALLS = {
    "trace_sizes": lambda: mha_trace.trace_sizes(d_model=16, heads=4),
    "trace": lambda: mha_trace.trace(*_module_and_input()),
    "heads": lambda: mha_trace.heads("cat-sat-on-mat"),
    "explain": lambda: mha_trace.explain("cat-sat-on-mat", token="cat"),
    "explain(rope_planes)": lambda: mha_trace.explain("chicken-road", token="it", rope=True, rope_planes=True),
    "explain(tiled)": lambda: mha_trace.explain("cat-sat-on-mat", token="sat", impl="tiled", block_k=2),
    "ablate": lambda: mha_trace.ablate("cat-sat-on-mat", removed=(1,)),
    "compare": lambda: mha_trace.compare("cat-sat-on-mat"),
    "verify": lambda: mha_trace.verify(d_model=16, heads=4),
    "verify(module)": lambda: mha_trace.verify("example:l04", d_model=16, heads=4),
    "cost": lambda: mha_trace.cost(preset="gpt2-small"),
    "cost(io)": lambda: mha_trace.cost(preset="gpt2-medium", io=True, backward=True),
    "train": lambda: mha_trace.train("previous-token", steps=3, snapshots=2),
    "model.heads": lambda: _minilm().heads(head="1.3"),
    "model.explain": lambda: _minilm().explain(token="animal", head="1.3"),
    "model.explain(tiled)": lambda: _minilm().explain(token="animal", head="1.3", impl="tiled"),
    "model.trace": lambda: _minilm().trace(layer=1),
    "model.survey": lambda: _minilm().survey("The cat sat on the mat."),
    "model.ablate": lambda: _minilm().ablate(heads=["1.3"]),
    "model.rank": lambda: _minilm().rank("The cat sat."),
    "model.patch (smollm2)": lambda: mha_trace.model("smollm2").patch(  # the README's pair
        "The capital of France is", "The capital of Italy is", metric="logit-diff: Paris, Rome"),
    "model.cache (smollm2)": lambda: mha_trace.model("smollm2").cache("The cat sat on the mat.", budgets=[4],
                                                            policies="window", sinks=1),
    "model.hear (whisper)": lambda: mha_trace.model("whisper").hear("examples/audio/cat.wav", timestamps=True),
}


def _module_and_input():
    import torch

    from mha_trace.core.attention import MultiHeadAttention

    return MultiHeadAttention(8, 2), torch.randn(1, 3, 8)


_model = {}


def _minilm():
    return _model.setdefault("minilm", mha_trace.model("minilm"))


@pytest.mark.parametrize("name", CALLS)
@pytest.mark.slow
def test_every_api_result_prints_renders_and_has_its_json(name):
    r = CALLS[name]()
    assert isinstance(r, Shows), type(r)
    text = str(r)
    assert text.strip() and not text.startswith(type(r).__name__ + "("), text[:200]
    html = r._repr_html_()
    assert html.startswith('<div class="mha-trace"') and html.count('<div class="mha-trace"') == 1
    data = json.loads(r.to_json())
    assert isinstance(data, dict) and data


def test_print_is_the_terminal_text(cli):
    """The verdict of verify, as print(r) gives it and as the command prints it (plain, 100 wide)."""
    r = mha_trace.verify("example:l04", d_model=16, heads=4)
    assert str(r) == cli("verify", "--module", "example:l04", "--d-model", "16", "--heads", "4").stdout
