"""One way in: every source becomes one Run through `resolve`; heads' JSON has one schema whatever
the source; --include-inputs lets anyone recompute a run; the API refuses bad input by name."""

import json

import numpy as np
import pytest
import torch

import mha_trace
from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions, resolve


def softmax(s):
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


@pytest.mark.parametrize("options,default,label,tokens", [
    (RunOptions(), "config", "", ("The", "cat", "sat", "on", "mat")),
    (RunOptions(d_model=64, heads=4, seq=3), "sizes", "", ()),
    (RunOptions(module="example:l04", d_model=64, heads=4), "sizes", "MultiHeadAttention from example:l04", ()),
    (RunOptions(module="example:committee"), "config", "MultiHeadAttention from example:committee",
     ("The", "cat", "sat", "on", "mat")),
    (RunOptions(model="minilm", sentence="The cat sat.", layer=2), "config", "all-MiniLM-L6-v2 layer 2 attention",
     ("[CLS]", "the", "cat", "sat", ".", "[SEP]")),
])
@pytest.mark.slow
def test_every_source_is_one_run(options, default, label, tokens):
    run = resolve(options, default)
    assert run.label == label and tuple(run.tokens) == tokens
    output = run.forward()
    assert torch.isfinite(output[0] if isinstance(output, tuple) else output).all()


def test_a_models_run_is_its_layer_on_its_sentence():
    run = resolve(RunOptions(model="minilm", sentence="The cat sat.", layer=2))
    assert run.layer == 2 and run.sentence.text == "The cat sat."
    _, weights = run.forward()
    np.testing.assert_allclose(weights[0].numpy(), run.sentence.weights[1], atol=1e-6)


@pytest.mark.parametrize("args", [
    ("heads",), ("heads", "--module", "example:committee"), ("heads", "--model", "minilm", "--layer", "2"),
    ("heads", "--model", "smollm2", "--head", "3.4")])
@pytest.mark.slow
def test_heads_json_has_one_schema_whatever_the_source(cli, args):
    data = json.loads(cli(*args, "--format", "json").stdout)
    assert list(data) == ["schema_version", "command", "source", "settings", "tokens", "decimals",
                          "mask", "heads", "average", "output"]
    assert data["schema_version"] == 2 and data["source"]["kind"] in ("config", "module", "model")
    T = len(data["tokens"])
    for h in data["heads"]:
        assert {"layer", "head", "kv_head", "weights"} <= set(h)
        assert np.allclose(np.array(h["weights"]).sum(-1), 1) and np.shape(h["weights"]) == (T, T)
    if data["settings"]["mask"] == "causal":  # a model's causal mask is in the JSON too
        assert np.array_equal(data["mask"], np.tril(np.ones((T, T), bool)))


def test_include_inputs_lets_anyone_recompute_the_heads_by_hand(cli):
    data = json.loads(cli("heads", "--config", "animal-street", "--format", "json",
                          "--include-inputs").stdout)
    given, H = data["inputs"], data["settings"]["heads"]
    x = np.array(given["args"][0])[0]  # (T, D): q = k = v = x for a generated config
    W = {name: np.array(w) for name, w in given["weights"].items()}
    q, k = x @ W["W_q.weight"].T, x @ W["W_k.weight"].T
    d_k = q.shape[1] // H
    allowed = np.ones((len(x), len(x)), bool) if data["mask"] is None else np.array(data["mask"])
    assert data["settings"]["mask"] == "causal" and not allowed.all()  # the mask is applied too
    for h, head in enumerate(data["heads"]):
        cols = slice(h * d_k, (h + 1) * d_k)
        scores = q[:, cols] @ k[:, cols].T / np.sqrt(d_k)
        by_hand = softmax(np.where(allowed, scores, -np.inf))
        np.testing.assert_allclose(head["weights"], by_hand, atol=1e-12)


def test_include_inputs_on_shapes_holds_every_parameter(cli):
    data = json.loads(cli("shapes", "--d-model", "8", "--heads", "2", "--seq", "3", "--format",
                          "json", "--include-inputs").stdout)
    shapes = {name: np.shape(w) for name, w in data["inputs"]["weights"].items()}
    assert shapes["W_q.weight"] == (8, 8) and shapes["W_o.bias"] == (8,)
    assert np.shape(data["inputs"]["args"][0]) == (2, 3, 8)


@pytest.mark.parametrize("args,message", [
    (("heads", "--include-inputs"), "Error: --include-inputs goes with --format json\n"),
    (("shapes", "--device", "meta", "--format", "json", "--include-inputs"),
     "Error: --include-inputs needs values, and meta tensors have none (run on --device cpu)\n"),
])
def test_include_inputs_refusals(cli, args, message):
    result = cli(*args)
    assert result.exit_code == 2 and result.stderr == message


@pytest.mark.parametrize("call,quantity", [
    (lambda: mha_trace.heads(mask="diagonal"), "mask"),
    (lambda: mha_trace.trace_sizes(impl="flash"), "impl"),
    (lambda: mha_trace.trace_sizes(device="cuda:0"), "device"),
    (lambda: mha_trace.trace_sizes(dtype="int32"), "dtype"),
    (lambda: mha_trace.trace_sizes(heads=2.0), "heads"),
    (lambda: mha_trace.compare(head_counts=[2.0]), "head_counts"),
    (lambda: mha_trace.heads(3.5), "config"),
    (lambda: mha_trace.heads(colour="red"), "colour"),
    (lambda: mha_trace.model("gpt2"), "model"),
    (lambda: mha_trace.model("minilm").heads(head=4.2), "head"),
    (lambda: mha_trace.model("minilm").heads(layer=9), "layer"),
    (lambda: mha_trace.model("minilm").explain(token="zebra"), "token"),
    (lambda: mha_trace.model("minilm").ablate(removed=[]), "removed"),
    (lambda: mha_trace.model("minilm").ablate(heads=[]), "removed"),  # the old name, this release
    (lambda: mha_trace.verify(3), "module"),
    (lambda: mha_trace.cost(batch="x"), "batch"),
])
def test_bad_input_through_the_api_raises_mha_error_naming_the_quantity(call, quantity):
    with pytest.raises(MhaError) as caught:
        call()
    assert caught.value.quantity == quantity


@pytest.mark.slow
def test_the_api_and_the_cli_give_the_same_model_json(cli):
    m = mha_trace.model("minilm")
    api = m.heads("The cat sat on the mat.", layer=3).data()
    command = json.loads(cli("heads", "--model", "minilm", "--sentence", "The cat sat on the mat.",
                             "--layer", "3", "--format", "json").stdout)
    assert {"schema_version": 2, **api} == command
    walk = m.explain("The cat sat on the mat.", token="cat", head="1.3")
    assert walk.only == 3 and json.loads(cli(
        "explain", "--model", "minilm", "--sentence", "The cat sat on the mat.", "--token", "cat",
        "--head", "1.3", "--format", "json").stdout) == {"schema_version": 2, **walk.data()}


COMPUTING = [("heads", "--head", "1"), ("explain", "--token", "cat"), ("compare", "--heads", "1,2"),
             ("ablate", "--head", "1"), ("heads", "--model", "minilm", "--head", "2.3"),
             ("explain", "--model", "minilm", "--head", "1.1", "--sentence", "The cat sat."),
             ("ablate", "--model", "minilm", "--head", "1.1", "--sentence", "The cat sat."),
             ("survey", "--sentence", "The cat sat on the mat."),
             pytest.param(("predict", "--top", "3"), marks=pytest.mark.slow)]  # SmolLM2


@pytest.mark.parametrize("args", COMPUTING, ids=lambda a: " ".join(a[:3]))
def test_device_reaches_every_command_that_computes(cli, args):
    """--device cpu is what runs without it; cuda runs there where torch has CUDA and is one
    Error line where it has not; meta, which holds no numbers, is refused by name."""
    plain = cli(*args, "--format", "json")
    assert plain.exit_code == 0, plain.output
    assert cli(*args, "--device", "cpu", "--format", "json").output == plain.output
    cuda = cli(*args, "--device", "cuda", "--format", "json")
    if torch.cuda.is_available():
        assert cuda.exit_code == 0 and json.loads(cuda.output).keys() == json.loads(plain.output).keys()
    else:
        assert cuda.exit_code == 1 and cuda.output.startswith("Error: --device cuda was asked for")
    meta = cli(*args, "--device", "meta")
    assert meta.exit_code != 0 and "meta tensors hold none" in meta.output
    assert len(meta.output.strip().splitlines()) == 1


def test_a_models_run_carries_its_device():
    run = resolve(RunOptions(model="minilm", sentence="The cat sat.", layer=2, device="cpu"))
    assert run.sizes.device == "cpu" and run.x.device.type == "cpu"
    assert {p.device.type for p in run.module.parameters()} == {"cpu"}
    m = mha_trace.model("minilm", device="cpu")
    assert m.model.device.type == "cpu" and m.run("The cat sat.").sizes.device == "cpu"
    with pytest.raises(MhaError) as e:
        mha_trace.model("minilm", device="meta")
    assert e.value.quantity == "device"
