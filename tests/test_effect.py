"""--effect: attention weighted by what it moves (Kobayashi et al. 2020), on every source.

Effect weights are checked against plain loops over heads, queries and keys (a config), against
the module's own output (what a head adds is the effect-weighted sum of its keys' f_h), and
against tests/fixtures/effect_reference.npz: transformers' own BertModel and LlamaForCausalLM,
their value projections hooked, made by tests/fixtures/make_effect_reference.py.
"""

import json
from pathlib import Path

import numpy as np
import pytest
from slides import laid_out

import mha_trace
from mha_trace.analyses.walk import walk
from mha_trace.analyses.model_heads import word_weights

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

REFERENCE = np.load(Path(__file__).parent / "fixtures" / "effect_reference.npz")
META = json.loads(str(REFERENCE["meta"]))


def by_hand(view) -> np.ndarray:
    """(heads, T, T): a_ij ‖v_j (its K/V head's block) · W_O (head h's rows)‖, renormalised."""
    H, T, d = view.heads, len(view.tokens), view.d_k
    out = np.zeros((H, T, T))
    for h in range(H):
        g = view.kv_head_of(h)
        norms = [np.linalg.norm(view.v[j, g * d:(g + 1) * d] @ view.W_O[h * d:(h + 1) * d])
                 for j in range(T)]
        for i in range(T):
            row = [view.weights[h, i, j] * norms[j] for j in range(T)]
            total = sum(row)
            out[h, i] = [x / total if total else 0.0 for x in row]
    return out


@pytest.mark.parametrize("config,options", [
    ("cat-sat-on-mat", {}), ("permuted-wo", {}), ("chicken-road", {}),
    ("chicken-road", {"kv_heads": 2}), ("animal-street", {}), ("chicken-road", {"rope": True})])
def test_effect_weights_equal_plain_loops(config, options):
    view = mha_trace.heads(config, effect=True, **options)
    np.testing.assert_allclose(view.effect[0], by_hand(view), atol=1e-12)
    np.testing.assert_allclose(view.effect[0].sum(-1), 1.0, atol=1e-12)


def test_what_a_head_adds_is_its_effect_weighted_sum():
    """f_h is what the module adds: Σ_j a_ij f_h(x_j) equals head h's slice of the module's own
    concatenation times its rows of W_O, and the effect weights are that sum's shares by length."""
    view = mha_trace.heads("chicken-road", effect=True, kv_heads=4)
    d = view.d_k
    for h in range(view.heads):
        g = view.kv_head_of(h)
        f = view.v[:, g * d:(g + 1) * d] @ view.W_O[h * d:(h + 1) * d]  # (T, D)
        added = view.concat[:, h * d:(h + 1) * d] @ view.W_O[h * d:(h + 1) * d]
        np.testing.assert_allclose(view.weights[h] @ f, added, atol=1e-10)
        moved = view.weights[h] * np.linalg.norm(f, axis=1)
        np.testing.assert_allclose(view.effect[0, h], moved / moved.sum(1, keepdims=True))


def test_the_chapters_sat_gets_weight_but_moves_nothing_in_head_1():
    """The chapter's V gives 'sat' and 'on' zero values in head 1's columns: 'cat' gives 'sat'
    0.3664 of its weight there, and none of the effect."""
    w = mha_trace.explain("cat-sat-on-mat", token="cat", effect=True)
    sat = w.heads[0].terms[2]
    assert sat.weight == pytest.approx(0.3664, abs=5e-5) and sat.moved == 0 and sat.effect == 0
    assert [t.effect for t in w.heads[0].terms] == pytest.approx([0.7067, 0.1718, 0, 0, 0.1215],
                                                                  abs=5e-5)


@pytest.mark.parametrize("config", ["chicken-road", "animal-street"])
def test_the_walk_computes_the_same_effect_by_hand(config):
    view = mha_trace.heads(config, effect=True, kv_heads=2)
    for position in (0, 4, 10):
        w = walk(view, position)
        for hw in w.heads:
            np.testing.assert_allclose([t.effect for t in hw.terms],
                                       view.effect[0, hw.head - 1, position], atol=1e-12)


def test_effect_reaches_the_json_of_heads_and_explain(cli):
    data = json.loads(cli("heads", "--config", "chicken-road", "--effect", "--format", "json").stdout)
    view = mha_trace.heads("chicken-road", effect=True)
    for entry in data["heads"]:
        np.testing.assert_allclose(entry["effect"], view.effect[0, entry["head"] - 1], atol=5e-5)
    plain = json.loads(cli("heads", "--config", "chicken-road", "--format", "json").stdout)
    assert "effect" not in plain["heads"][0]  # without --effect, the schema is unchanged
    data = json.loads(cli("explain", "--token", "cat", "--effect", "--format", "json").stdout)
    keys = data["heads"][0]["keys"]
    assert [k["moved"] for k in keys] == pytest.approx([1, 1, 0, 0, 0.5 ** 0.5])
    assert [k["effect"] for k in keys] == pytest.approx([0.7067, 0.1718, 0, 0, 0.1215], abs=5e-5)


def test_a_users_module_is_refused_in_one_line(cli):
    result = cli("heads", "--module", "example:chapter_torch", "--effect")
    assert result.exit_code == 2
    assert result.stderr.startswith("Error: --effect: needs each head's value vectors and W_O")
    assert len(result.stderr.splitlines()) == 1


@pytest.fixture(scope="module")
def minilm():
    return mha_trace.model("minilm")


@pytest.fixture(scope="module")
def smollm2():
    return mha_trace.model("smollm2")


def test_minilm_effect_equals_transformers(minilm):
    view = minilm.heads(META["sentence"], effect=True)
    np.testing.assert_allclose(view.effect, REFERENCE["minilm_sentence_effect"], atol=2e-5)
    one = minilm.heads(META["sentence"], head="3.1", effect=True)
    np.testing.assert_allclose(one.effect, view.effect)  # every layer, whatever is shown


def test_smollm2_effect_equals_transformers_under_grouped_query_attention(smollm2):
    view = smollm2.heads(META["sentence"], layer=2, effect=True)
    layers = [l - 1 for l in META["smollm2_layers"]]
    np.testing.assert_allclose(view.effect[layers], REFERENCE["smollm2_sentence_effect"], atol=5e-5)


@pytest.mark.parametrize("name,head", [("minilm", "3.1"), ("smollm2", "15.4")])
def test_a_models_walk_and_its_heads_agree_on_the_effect(name, head, request):
    """Two paths: the layer's run through the lecture's module (explain), and every layer of the
    sentence from its inputs (heads)."""
    m = request.getfixturevalue(name)
    layer, h = map(int, head.split("."))
    view = m.heads(META["sentence"], head=head, effect=True)
    for position in (0, 5):
        w = m.explain(META["sentence"], position=position, head=head, effect=True)
        np.testing.assert_allclose([t.effect for t in w.heads[h - 1].terms],
                                   view.effect[layer - 1, h - 1, position], atol=2e-6)


def test_words_group_the_effect_as_they_group_the_weights(minilm):
    text = "Unbelievably, the cat saw the cat."
    pieces = minilm.heads(text, effect=True)
    words = minilm.heads(text, effect=True, words=True)
    np.testing.assert_allclose(words.effect, word_weights(minilm.run(text).sentence, pieces.effect)[1])
    np.testing.assert_allclose(words.effect.sum(-1), 1.0, atol=1e-9)
    hidden = minilm.heads(text, effect=True, hide_special=True)
    np.testing.assert_allclose(hidden.effect, pieces.effect[..., 1:-1, :][..., 1:-1])


def test_the_terminal_shows_each_head_beside_its_effect(cli):
    out = cli("heads", "--model", "minilm", "--head", "3.1", "--effect", "--sentence",
              "The cat sat.", "--width", "100").stdout
    assert out.index("Head 3.1\n") < out.index("Head 3.1: effect\n")
    assert "Effect: each weight times the length" in out
    overview = cli("heads", "--model", "minilm", "--effect", "--sentence", "The cat sat.").stdout
    assert overview.startswith("all-MiniLM-L6-v2: every head's effect weights on")


def test_slides_put_each_heads_effect_beside_its_weights(cli, kept_slides):
    from mha_trace.render import heatmaps, walk_slide

    made = kept_slides(heatmaps, walk_slide)
    assert cli("heads", "--config", "chicken-road", "--head", "2", "--effect", "--png", "x.png").exit_code == 0
    titles = [ax.get_title() for ax in made[-1].axes if ax.get_title()]
    assert titles == ["head 2", "head 2 effect"]
    assert cli("heads", "--model", "minilm", "--head", "3.1", "--effect", "--sentence", "The cat sat.",
               "--png", "x.png").exit_code == 0
    titles = [ax.get_title() for ax in made[-1].axes if ax.get_title()]
    assert titles == ["head 3.1", "head 3.1 effect"]
    laid_out(made[-1])
    assert cli("explain", "--token", "cat", "--effect", "--png", "x.png").exit_code == 0
    legend = [t.get_text() for t in made[-1].legends[0].get_texts()]
    assert "weight" in legend and any(t.startswith("effect") for t in legend)
    # one or two heads: each weight and each effect of 0.03 or more written on its bar
    data = json.loads(cli("explain", "--token", "cat", "--head", "1", "--effect", "--format", "json").stdout)
    assert cli("explain", "--token", "cat", "--head", "1", "--effect", "--png", "x.png").exit_code == 0
    terms = data["heads"][0]["keys"]
    expected = [f"{k['weight']:.2f}" for k in terms if k["weight"] >= 0.03] + \
        [f"{k['effect']:.2f}" for k in terms if k["effect"] >= 0.03]
    assert [t.get_text() for t in made[-1].axes[1].texts] == expected
    laid_out(made[-1])
