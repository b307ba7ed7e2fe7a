"""One conformance test over every registered model (the registry's, a run of mha-trace train,
and a LLaMA-shaped model with random weights that this test registers): each satisfies the model
interface its capabilities declare, reproduces an independent computation of its attention (and
its kept transformers fixture where it has one), and runs every view through the same door."""

import json
from pathlib import Path

import numpy as np
import pytest

import tiny_llama
from mha_trace.io.audio import read_wav
from mha_trace.models import base, registry

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

FIXTURES = Path(__file__).parent / "fixtures"
TEXT = "the cat sat on the mat because it was tired"
CHECKS = {  # what each name is read with: its text, and a token of it to follow
    "minilm": ("The cat sat on the mat because it was tired.", "it"),
    "smollm2": ("The cat sat on the mat because it was tired.", "␣it"),
    "tiny-llama": (TEXT, "it"),
    "run.pt": (None, None),  # a trained run reads its probe (token ids), its first token
}
HEARS = {"whisper": "examples/audio/cat.wav"}  # a model that hears audio, and a clip for it


@pytest.fixture(scope="module", autouse=True)
def tiny_registered():
    registry.register(tiny_llama.ENTRY)
    yield
    registry.MODELS.pop(tiny_llama.ENTRY.key)


def test_every_registered_model_is_checked_here():
    assert set(registry.MODELS) | {registry.TRAINED.key} == set(CHECKS) | set(HEARS)
    assert {k for k, e in registry.MODELS.items() if e.audio} == set(HEARS)


@pytest.fixture(params=sorted(CHECKS))
def named(request, default_run):
    """(--model name, text, token) of each registered model; the trained run's checkpoint."""
    name = str(default_run) if request.param == "run.pt" else request.param
    return name, *CHECKS[request.param]


def _model(name):
    from mha_trace.runs.resolve import RunOptions, load

    return load(RunOptions(model=name))


def test_it_satisfies_the_interface_its_capabilities_declare(named):
    m = _model(named[0])
    c = m.capabilities
    assert isinstance(m, base.AttentionModel)
    assert isinstance(m, base.Decoder) == c.decodes
    assert isinstance(m, base.LanguageModel) == c.language_model
    assert isinstance(m, base.TrainedRun) == c.trained_run
    assert c.causal == c.decodes and c.rope == (m.rope_base is not None)
    assert registry.entry(m.key).pass_seconds  # the time guards can price it
    _declares_its_size(m)


def _declares_its_size(m) -> None:
    """The sizes --layer and --head are judged by before it loads are its own, under its name."""
    card = registry.entry(m.key)
    assert card.size is None or (card.size == (m.layers, m.heads) and card.title == m.name)
    assert card.size or card in (registry.TRAINED, tiny_llama.ENTRY)  # every registry model declares


def _softmax_attention(m, inputs, layer: int) -> np.ndarray:
    """Layer `layer`'s weights from its parameters in NumPy (float64): q, k with their biases,
    RoPE on halves of each head's columns, K/V heads shared, ÷√d_k, causal when the model is."""
    a = m.attention_module(layer)
    x = m.attention_input(inputs, layer)[0].double().cpu().numpy()
    proj = lambda lin: x @ lin.weight.detach().double().cpu().numpy().T + (
        0 if lin.bias is None else lin.bias.detach().double().cpu().numpy())
    T, H, G = len(x), m.heads, m.kv_heads or m.heads
    q, k = proj(a.W_q).reshape(T, H, -1), proj(a.W_k).reshape(T, G, -1)
    d = q.shape[-1]
    if m.capabilities.rope:
        angle = np.arange(T)[:, None] * m.rope_base ** (-np.arange(0, d, 2) / d)  # (T, d/2)
        cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
        turn = lambda t: np.concatenate([t[..., :d // 2] * cos - t[..., d // 2:] * sin,
                                         t[..., d // 2:] * cos + t[..., :d // 2] * sin], -1)
        q, k = turn(q), turn(k)
    k = np.repeat(k, H // G, axis=1)
    s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(d)
    if m.capabilities.causal:
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_its_weights_equal_an_independent_computation_and_its_fixture(named):
    name, text, _ = named
    m = _model(name)
    s = m.encode(text if text else m.default_text)
    for layer in range(1, m.layers + 1):
        np.testing.assert_allclose(s.weights[layer - 1], _softmax_attention(m, s.inputs, layer),
                                   atol=2e-5, rtol=0)
    kept = FIXTURES / f"{name}_reference.npz"
    if kept.exists():  # transformers' own numbers, kept (tests/fixtures/make_*_reference.py)
        reference = np.load(kept)
        first = json.loads(str(reference["meta"]))["sentences"][0]
        np.testing.assert_allclose(m.encode(first).weights, reference["s0_attentions"],
                                   atol=1e-4, rtol=0)


def _views(name: str, text: str | None, token: str | None) -> list:
    said = [] if text is None else ["--sentence", text]
    follow = [] if token is None else ["--token", token]
    return [["heads", "--model", name, *said, "--head", "1.1"],
            ["explain", "--model", name, *said, *follow, "--head", "2.1"],
            ["explain", "--model", name, *said, *follow, "--head", "2.1", "--why"],
            ["heads", "--model", name, *said, "--layer", "1", "--effect", "--format", "json"],
            ["shapes", "--model", name, *said],
            ["survey", "--model", name, *(["--sentence", text] if text else []), "--top", "1"]]


def test_every_view_runs_on_it_through_the_same_door(named, cli):
    name, text, token = named
    for args in _views(name, text, token):
        result = cli(*args)
        assert result.exit_code == 0, (args, result.stderr)
        assert result.stdout.strip() and not result.stderr.strip(), args
    m = _model(name)
    if m.capabilities.decodes:
        result = cli("cache", "--model" if text else "--checkpoint", name, "--tokens", "16",
                     "--budget", "12", "--policy", "full,h2o", "--format", "json")
        assert result.exit_code == 0, result.stderr
        lab = json.loads(result.stdout)
        assert len(lab["results"]) == 2


@pytest.mark.parametrize("name", sorted(HEARS))
def test_a_model_that_hears_satisfies_its_interface_and_runs_its_views_through_the_door(name, cli):
    """An encoder-decoder that hears: the audio interface its capabilities declare, its kept
    reference (tests/test_whisper.py checks every number of it), its survey through the same
    door, every text view refused without --audio in one line that names what it does, and with
    it every view of its cross-attention and of its encoder's self-attention (the decoder's own
    self-attention: the next test)."""
    from mha_trace.runs.resolve import RunOptions, load

    m = load(RunOptions(model=name, audio=HEARS[name]))
    assert m.capabilities.audio and isinstance(m, base.AudioModel)
    assert not isinstance(m, base.AttentionModel)  # it reads no text: no sentence to encode
    assert (FIXTURES / f"{name}_reference.npz").exists()
    assert registry.entry(m.key).pass_seconds and registry.entry(m.key).install
    _declares_its_size(m)
    result = cli("survey", "--model", name, "--audio", HEARS[name], "--timestamps", "--format", "json")
    assert result.exit_code == 0 and json.loads(result.stdout)["words"], result.stderr
    for args in _views(name, "The cat sat on the mat.", "cat"):
        result = cli(*args)
        assert result.exit_code == 2 and f"--model {name} --audio" in result.stderr, args
    clip = ("--model", name, "--audio", HEARS[name])
    for args in (["heads", *clip], ["heads", *clip, "--head", "4.3"],  # its cross-attention
                 ["explain", *clip, "--position", "1"], ["explain", *clip, "--position", "1", "--effect"],
                 ["explain", *clip, "--position", "1", "--head", "4.3", "--why"], ["shapes", *clip],
                 ["heads", *clip, "--attention", "encoder"], ["heads", *clip, "--attention", "encoder",
                 "--head", "1.1"], ["explain", *clip, "--attention", "encoder", "--token", "1s", "--effect"],
                 ["explain", *clip, "--attention", "encoder", "--token", "1s", "--head", "1.1", "--why"],
                 ["shapes", *clip, "--attention", "encoder"]):  # its encoder's self-attention
        result = cli(*args)
        assert result.exit_code == 0 and result.stdout.strip() and not result.stderr.strip(), (args, result.stderr)


@pytest.mark.parametrize("name", sorted(HEARS))
def test_its_decoder_reading_what_it_wrote_is_a_text_model_through_the_same_door(name, cli):
    """--attention self: the decoder over its own transcription is an AttentionModel like the
    others: its weights are the transcription's and NumPy's from the parameters, the residual
    stream's sources (the cross-attentions among them) add up to what each layer's attention
    reads, and every text view runs on it."""
    from mha_trace.models.stream import stream_parts
    from mha_trace.runs.resolve import RunOptions, load

    m = load(RunOptions(model=name, audio=HEARS[name], attention="self"))
    assert isinstance(m, base.AttentionModel) and not isinstance(m, base.Decoder)
    s = m.encode(m.default_text)
    heard = load(RunOptions(model=name, audio=HEARS[name])).transcribe(read_wav(HEARS[name]))
    assert s.ids == heard.ids
    np.testing.assert_allclose(s.weights, heard.self_weights, atol=1e-6, rtol=0)
    for layer in range(1, m.layers + 1):
        np.testing.assert_allclose(s.weights[layer - 1], _softmax_attention(m, s.inputs, layer),
                                   atol=2e-5, rtol=0)
    parts = stream_parts(m, s.ids, m.layers)
    assert f"L{m.layers - 1} cross-attention" in parts
    np.testing.assert_allclose(sum(parts.values()).numpy(),
                               m.attention_input(s.inputs, m.layers)[0].double().numpy(), atol=1e-4)
    for args in _views(name, None, "cat")[:-1]:  # the survey is the cross-attention's
        result = cli(*args, "--audio", HEARS[name], "--attention", "self")
        assert result.exit_code == 0, (args, result.stderr)
        assert result.stdout.strip() and not result.stderr.strip(), args


def test_a_second_door_refuses_what_the_first_refuses():
    """The guards travel with each call: a view raised to 400 tokens never lends its limit."""
    from mha_trace.errors import MhaError
    from mha_trace.runs.resolve import RunOptions, encode

    registry.register(tiny_llama.ENTRY)
    long = " ".join(["the cat"] * 40)  # 81 tokens with BOS; the entry's guard is 64
    assert len(encode(RunOptions(model="tiny-llama", sentence=long, max_tokens=100)).ids) == 81
    with pytest.raises(MhaError, match="the limit here is 64"):
        encode(RunOptions(model="tiny-llama", sentence=long))


def test_records_keep_a_card_never_the_live_model(default_run):
    """What a model's command returns is plain data: its records hold the model's card (name,
    sizes, capabilities) and token strings, so a renderer never calls the model."""
    import dataclasses

    import mha_trace
    from mha_trace.models.base import AttentionModel

    def live(value, depth=0) -> bool:
        if isinstance(value, AttentionModel):
            return True
        if depth > 3:
            return False
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return any(live(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
        if isinstance(value, (list, tuple)):
            return any(live(v, depth + 1) for v in value[:5])
        return False

    minilm, smollm2 = mha_trace.model("minilm"), mha_trace.model("smollm2")
    records = [minilm.heads(head="1.1"), minilm.survey("The cat sat on the mat."), minilm.rank("A cat."),
               smollm2.ablate("The capital of France is", removed=["1.1"]),
               smollm2.predict("The capital of France is", top=2, generate=1),
               smollm2.cache(policies=("full",), budgets=(16,), tokens=32),
               mha_trace.model(str(default_run)).composition()]  # a decoder's; SmolLM2's takes 6 s
    assert [type(r).__name__ for r in records if live(r)] == []
    assert records[3].words[records[3].top] == "␣Paris"  # token strings, made where the record is
