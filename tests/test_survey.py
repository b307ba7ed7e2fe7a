"""The survey: detectors on constructed heads, against transformers, over the bundled corpus.

Detector scores are checked three ways: on hand-made weight matrices with known answers, against
tests/fixtures/detector_reference.npz (transformers' own attention weights for fresh sentences and
random tokens, scored by plain loops in tests/fixtures/make_detector_reference.py), and the corpus
survey's JSON against the weights of each sentence run alone. Each model's corpus survey runs once.
"""

import json
from pathlib import Path

import numpy as np
import pytest

from mha_trace.models import corpus
from mha_trace.core.detectors import detect
from mha_trace.models import load_model

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

REFERENCE = np.load(Path(__file__).parent / "fixtures" / "detector_reference.npz")
META = json.loads(str(REFERENCE["meta"]))


def _survey(name: str):
    import mha_trace

    return mha_trace.model(name).survey(effect=True)


@pytest.fixture(scope="session")
def minilm_survey():
    return _survey("minilm")  # one for the whole run (SHARED in conftest)


@pytest.fixture(scope="session")
def smollm2_survey():
    return _survey("smollm2")


@pytest.fixture(scope="session")
def minilm_corpus(minilm_survey):
    return json.loads(minilm_survey.to_json())


@pytest.fixture(scope="session")
def smollm2_corpus(smollm2_survey):
    return json.loads(smollm2_survey.to_json())


def _text(result, width: int = 100) -> str:
    """The survey as the terminal shows it, with rich's line breaks undone."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    Console(file=buffer, width=width, color_system=None).print(result)
    return " ".join(buffer.getvalue().split())


def _behaviour(data: dict, name: str) -> dict:
    return next(b for b in data["behaviours"] if b["name"] == name)


# ---- detectors on constructed heads -------------------------------------------------------------

def test_detectors_find_constructed_heads_of_an_encoder():
    T = 6
    prev = np.eye(T, k=-1)
    prev[0, 0] = 1.0  # the first query has no previous token: it looks at itself
    first = np.zeros((T, T))
    first[:, 0] = 1.0
    weights = np.stack([np.stack([np.eye(T), prev, first])])  # (1 layer, 3 heads, T, T)
    tokens = ("[CLS]", "a", ",", "b", ".", "[SEP]")
    found = detect(weights, tokens, (101, 1, 2, 3, 4, 102), causal=False)
    assert found["self"].scores[0].tolist() == [1.0, pytest.approx(1 / T), pytest.approx(1 / T)]
    # queries 1..5 each have a previous key; only query 1's is the first token
    assert found["previous token"].scores[0].tolist() == [0.0, 1.0, pytest.approx(1 / (T - 1))]
    assert found["[CLS]"].scores[0].tolist() == [
        pytest.approx(1 / T), pytest.approx(2 / T), 1.0]
    assert found["punctuation"].scores[0, 0] == pytest.approx(2 / T)  # self on "," and "."
    assert found["previous token"].chance == pytest.approx(1 / T)  # one key of the T it sees
    assert found["punctuation"].chance == pytest.approx(2 / T)
    assert "duplicate token" not in found and "induction" not in found  # nothing repeats


def test_duplicate_and_induction_on_a_repeated_phrase_of_a_causal_model():
    ids = (7, 1, 2, 3, 1, 2, 3)  # "x a b c a b c": positions 4-6 repeat 1-3
    T = len(ids)
    dup = np.zeros((T, T))
    ind = np.zeros((T, T))
    for q in range(T):
        dup[q, q - 3 if q >= 4 else 0] = 1.0  # to the earlier copy
        ind[q, q - 2 if q >= 4 else 0] = 1.0  # to the token after the earlier copy
    found = detect(np.stack([np.stack([dup, ind])]), ("x", "a", "b", "c", "a", "b", "c"), ids,
                   causal=True)
    assert found["duplicate token"].scores[0].tolist() == [1.0, 0.0]  # queries 4, 5, 6
    # query 4's earlier copy is at 1, the token after it at 2 (not its previous token, 3)
    assert found["induction"].scores[0].tolist() == [0.0, 1.0]
    # a causal query q sees q + 1 keys: one earlier copy among them
    assert found["duplicate token"].chance == pytest.approx(np.mean([1 / 5, 1 / 6, 1 / 7]))
    assert "first token" in found and "next token" not in found


def test_transformerlens_worked_example():
    """TransformerLens' head-detector demo scores a previous-token pattern 1.3/4 = 0.325 (the
    weight on the previous token over all the weight), or 0.8/0.95 ≈ 0.842 with the first key
    and the query itself left out. mha-trace averages over the queries that have a previous
    token: the same 1.3 over 3 queries, 0.433."""
    w = np.array([[1.0, 0, 0, 0],
                  [0.5, 0.5, 0, 0],
                  [0.1, 0.4, 0.5, 0],
                  [0.2, 0.15, 0.4, 0.25]])
    sub = np.diag(w, -1)
    assert sub.sum() / w.sum() == pytest.approx(0.325)
    rest = w.copy()
    rest[:, 0] = 0
    np.fill_diagonal(rest, 0)
    assert (sub[1:].sum()) / rest.sum() == pytest.approx(0.8 / 0.95)
    found = detect(w[None, None], ("a", "b", "c", "d"), (1, 2, 3, 4), causal=True)
    assert found["previous token"].scores[0, 0] == pytest.approx(1.3 / 3)
    assert found["previous token"].scores[0, 0] * 3 / 4 == pytest.approx(0.325)


# ---- against transformers ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["minilm", "smollm2"])
def test_detector_scores_match_transformers_weights(name):
    model = load_model(name)
    for i, text in enumerate(META["sentences"]):
        s = model.encode(text)
        assert list(s.ids) == REFERENCE[f"{name}_s{i}_ids"].tolist()
        found = detect(s.weights, s.tokens, s.ids, model.capabilities.causal)
        theirs = {k.split("_", 2)[2] for k in REFERENCE.files if k.startswith(f"{name}_s{i}_")} - {"ids"}
        assert set(found) == theirs, text
        for detector, f in found.items():
            np.testing.assert_allclose(f.scores, REFERENCE[f"{name}_s{i}_{detector}"], atol=1e-4,
                                       err_msg=f"{text}: {detector}")


def test_induction_scores_match_transformers_weights():
    from mha_trace.core.detectors import induction_scores

    model = load_model("smollm2")
    ids = REFERENCE["smollm2_random_ids"].tolist()
    _, _, weights = model.run(ids)
    w = np.stack([x[0].numpy() for x in weights])
    ours = induction_scores(w, META["random_half"], start=0)
    np.testing.assert_allclose(ours, REFERENCE["smollm2_random_induction"], atol=1e-4)
    assert ours.max() > 0.5  # SmolLM2 has induction heads


# ---- the corpus ---------------------------------------------------------------------------------

def test_the_bundled_corpus_is_varied_and_its_antecedents_are_in_their_sentences():
    c = corpus.bundled()
    assert len(c.sentences) >= 100 and len(set(c.sentences)) == len(c.sentences)
    roles = [p.role for p in c.antecedents]
    assert roles.count("subject") == roles.count("object") == 18
    assert sum("?" in s for s in c.sentences) >= 8 and sum('"' in s for s in c.sentences) >= 6
    assert sum(any(ch.isdigit() for ch in s) for s in c.sentences) >= 8
    from mha_trace.analyses.model_analysis import _word_spans

    for name in ("minilm", "smollm2"):
        model = load_model(name)
        for p in c.antecedents:
            ids, tokens, words = model.pieces(p.sentence)
            spans = _word_spans(type("S", (), {"tokens": tokens, "words": words})())
            assert {"it", p.antecedent, p.other} <= spans.keys(), (name, p.sentence)


def test_batched_corpus_scores_equal_each_sentence_run_alone(minilm_corpus):
    """The survey runs sentences of equal length together; each one's numbers must be those it
    gets alone. Previous-token and [CLS] statistics recomputed by hand from single runs."""
    model = load_model("minilm")
    texts = corpus.bundled().sentences
    assert minilm_corpus["sentences"] == texts
    prev, cls = [], []
    for text in texts:
        w = model.encode(text).weights.astype(np.float64)
        T = w.shape[-1]
        prev.append(np.mean([w[:, :, q, q - 1] for q in range(1, T)], axis=0))
        cls.append(np.mean([w[:, :, q, 0] for q in range(T)], axis=0))
    for name, per in (("previous token", prev), ("[CLS]", cls)):
        b = _behaviour(minilm_corpus, name)
        per = np.array(per)
        np.testing.assert_allclose(b["scores"], per.mean(0), atol=1e-5)
        np.testing.assert_allclose(b["spread"], per.std(0), atol=1e-5)
        assert (np.round(np.array(b["held"]) * len(texts)) == (per > 0.5).sum(0)).all()
        assert b["sentences"] == len(texts)


def test_sinks_by_layer_recomputed_from_the_corpus(minilm_corpus, smollm2_corpus):
    """MiniLM gives [SEP] under 0.1 in every layer, unlike BERT-base's middle layers (Clark et
    al. 2019), and parks about half on [CLS] in layers 2-5; SmolLM2 puts over half on its first
    token in most layers but the first two (Xiao et al. 2023's attention sinks)."""
    cls = np.array(minilm_corpus["sinks_by_layer"]["[CLS]"])
    sep = np.array(minilm_corpus["sinks_by_layer"]["[SEP]"])
    np.testing.assert_allclose(cls, np.mean(_behaviour(minilm_corpus, "[CLS]")["scores"], 1),
                               atol=1e-6)
    assert sep.max() < 0.1 and cls[1:5].min() > 0.45
    first = np.array(smollm2_corpus["sinks_by_layer"]["first token"])
    assert first[:2].max() < 0.2 and (first[2:] > 0.5).sum() >= 20


def test_the_literature_verdicts_follow_the_numbers(minilm_survey, smollm2_survey):
    sep = minilm_survey.sinks["[SEP]"]
    assert (f"give over half their attention to [SEP]. Not here: [SEP] gets at most {sep.max():.2f}"
            in _text(minilm_survey))
    first = smollm2_survey.sinks["first token"]
    assert (f"Llama-2 but the first two. Here too: layers 1-2 give it {first[0]:.2f} and "
            f"{first[1]:.2f}; the others {first[2:].mean():.2f} on average, and "
            f"{(first[2:] > 0.5).sum()} of 28 give it more than half" in _text(smollm2_survey))


EFFECT = np.load(Path(__file__).parent / "fixtures" / "effect_reference.npz")


@pytest.mark.parametrize("name,sinks", [("minilm", ("[CLS]", "[SEP]")), ("smollm2", ("first token",))])
def test_sink_shares_of_weight_and_effect_equal_transformers(name, sinks, request):
    """Over the bundled corpus, each sentence alone in transformers (make_effect_reference.py)."""
    result = request.getfixturevalue(f"{name}_survey")
    data = request.getfixturevalue(f"{name}_corpus")
    for sink in sinks:
        np.testing.assert_allclose(result.sinks[sink], EFFECT[f"{name}_{sink}_weight"], atol=2e-5)
        np.testing.assert_allclose(result.effect_sinks[sink], EFFECT[f"{name}_{sink}_effect"],
                                   atol=2e-5)
        assert data["sinks_effect_by_layer"][sink] == pytest.approx(result.effect_sinks[sink], abs=1e-6)


def test_the_effect_verdict_follows_the_numbers(minilm_survey, smollm2_survey):
    from mha_trace.render.survey import effect_verdict

    w, e = minilm_survey.sinks, minilm_survey.effect_sinks
    total_w, total_e = sum(w.values()), sum(e.values())
    assert (f"the [CLS] and [SEP] get {total_w.mean():.2f} of the weight and {total_e.mean():.2f} "
            f"of the effect on average" in _text(minilm_survey))
    assert "Most of the weight they get moves little" in _text(minilm_survey)
    assert total_e.mean() < 0.5 * total_w.mean()  # the numbers behind the words
    first = smollm2_survey.effect_sinks["first token"]
    assert f"get {smollm2_survey.sinks['first token'].mean():.2f} of the weight" not in _text(smollm2_survey)
    assert f"gets {smollm2_survey.sinks['first token'].mean():.2f} of the weight and {first.mean():.2f}" in _text(smollm2_survey)
    one = lambda *v: {"first token": np.array(v)}
    assert "moves little" in effect_verdict(one(0.8, 0.6), one(0.2, 0.2))
    assert "by less than half" in effect_verdict(one(0.8, 0.6), one(0.5, 0.5))
    assert "the weight reads as the effect" in effect_verdict(one(0.8, 0.6), one(0.7, 0.6))
    assert "widest gap is layer 2 (0.90" in effect_verdict(one(0.5, 0.9), one(0.4, 0.3))
    assert "no sink to speak of" in effect_verdict(one(0.05, 0.04), one(0.05, 0.05))


def test_the_effect_guide_shows_the_surveys_numbers(minilm_survey, smollm2_survey):
    """docs/effect.md's tables, quotes and reading are these runs' numbers."""
    import re

    from mha_trace.render.survey import effect_verdict

    text = (Path(__file__).parent.parent / "docs" / "effect.md").read_text()
    tables = re.findall(r"```text\n(.*?)```", text, re.S)[1:]
    for result, table in zip((minilm_survey, smollm2_survey), tables):
        rows = {}
        for line in table.splitlines():
            cells = line.split()
            if not cells[0].isdigit():
                continue  # a header
            for k in range(0, len(cells), 1 + 2 * len(result.sinks)):
                rows[int(cells[k])] = cells[k + 1:k + 1 + 2 * len(result.sinks)]
        expected = {l + 1: [f"{v[l]:.2f}" for n in result.sinks
                            for v in (result.sinks[n], result.effect_sinks[n])]
                    for l in range(result.model.layers)}
        assert rows == expected
        quoted = " ".join(effect_verdict(result.sinks, result.effect_sinks).split())
        assert quoted in " ".join(text.replace("> ", "").split())
    cls, moved = minilm_survey.sinks["[CLS]"][1:5], minilm_survey.effect_sinks["[CLS]"][1:5]
    flat = " ".join(text.split())
    assert f"{cls.mean():.2f} of the weight of layers 2 to 5 and {moved.mean():.2f}" in flat
    first = smollm2_survey.effect_sinks["first token"].mean() / smollm2_survey.sinks["first token"].mean()
    assert 0.7 < first < 0.8 and "three quarters of its share as effect" in flat
    cls = minilm_survey.effect_sinks["[CLS]"].mean() / minilm_survey.sinks["[CLS]"].mean()
    readme = " ".join((Path(__file__).parent.parent / "README.md").read_text().split())
    assert 0.17 < cls < 0.25 and "[CLS] sink keeps a fifth of its weight as effect" in readme
    assert "first token keeps three quarters" in readme


# ---- sources: --sentences FILE, --sentence, the API ----------------------------------------------

def test_sentences_from_a_file(cli, tmp_path):
    f = tmp_path / "mine.txt"
    f.write_text("# my sentences\nThe cat sat on the mat.\n\nA dog ran after the red ball.\n")
    data = json.loads(cli("survey", "--sentences", str(f), "--format", "json").stdout)
    assert data["sentences"] == ["The cat sat on the mat.", "A dog ran after the red ball."]
    assert data["corpus"] == f"2 sentences from {f}" and data["antecedents"] == []
    text = " ".join(cli("survey", "--sentences", str(f)).stdout.split())
    assert text.startswith(f"survey: all-MiniLM-L6-v2, 6 layers × 12 heads, on 2 sentences from {f}")


@pytest.mark.parametrize("content, args, message", [
    (None, ("--sentences", "{missing}"), "Error: --sentences: {missing}: not found"),
    ("# only a comment\n\n", ("--sentences", "{f}"),
     "Error: --sentences: {f}: has no sentences (one a line; lines starting with # are skipped)"),
    (b"\x00\x01binary", ("--sentences", "{f}"),
     "Error: --sentences: {f}: is a binary file, expected a text file with one sentence a line"),
    ("A line.\n", ("--sentences", "{f}", "--sentence", "x y z"),
     "Error: --sentences: choose one of --corpus, --sentence and --sentences"),
    ("A line.\n", ("--sentences", "{f}", "--corpus"),
     "Error: --sentences: choose one of --corpus, --sentence and --sentences"),
])
def test_bad_sentence_sources_get_one_line(cli, tmp_path, content, args, message):
    f, missing = tmp_path / "s.txt", tmp_path / "nope.txt"
    if isinstance(content, bytes):
        f.write_bytes(content)
    elif content is not None:
        f.write_text(content)
    fill = lambda a: a.format(f=f, missing=missing)
    result = cli("survey", *map(fill, args))
    assert result.exit_code == 2 and result.stderr == fill(message) + "\n"


def test_api_survey_over_a_list_and_the_corpus():
    import mha_trace

    m = mha_trace.model("minilm")
    mine = m.survey(sentences=["The cat sat on the mat.", "Where did you leave the keys?"])
    assert mine.corpus == "2 sentences" and len(mine.sentences) == 2
    assert mine.detectors["previous token"].scores.shape == (2, 6, 12)
    assert m.survey("The cat sat on the mat.").corpus == "\"The cat sat on the mat.\""


# ---- the guide's claims (docs/models.md), each checked over the corpus ------------------------------

def _right(result, role: str, head: str) -> int:
    """On how many of the role's sentences the head favours the true antecedent."""
    a = next(a for a in result.antecedents if a.role == role)
    layer, h = map(int, head.split("."))
    return int(round(a.right[layer - 1, h - 1] * len(a.sentences)))


def test_the_guides_claims_about_minilm_hold_over_the_corpus(minilm_survey):
    d = minilm_survey.detectors
    assert d["previous token"].held[0, 2] == 1.0 and d["previous token"].mean[0, 2] > 0.995  # 1.3
    assert round(d["next token"].held[1, 8] * 120) == 119  # 2.9
    assert (d["[CLS]"].held >= 0.9).sum() == 16
    cls, sep = minilm_survey.sinks["[CLS]"], minilm_survey.sinks["[SEP]"]
    assert [f"{x:.2f}" for x in cls] == ["0.23", "0.56", "0.58", "0.52", "0.58", "0.39"]
    assert f"{sep.max():.2f}" == "0.09"
    for name in ("self", "punctuation", "duplicate token", "induction"):
        assert (d[name].held >= 0.9).sum() == 0, name
    assert [(_right(minilm_survey, "subject", h), _right(minilm_survey, "object", h))
            for h in ("5.4", "4.1", "4.4", "4.2", "6.12")] == [(14, 13), (16, 2), (17, 2), (12, 11),
                                                               (13, 10)]


def test_no_head_resolves_it_and_some_follow_the_subject(minilm_survey, smollm2_survey):
    for result in (minilm_survey, smollm2_survey):
        roles = {a.role: a.right for a in result.antecedents}
        assert not ((roles["subject"] >= 0.8) & (roles["object"] >= 0.8)).any()
    roles = {a.role: a.right for a in smollm2_survey.antecedents}
    assert ((roles["subject"] >= 0.8) & (roles["object"] <= 0.2)).sum() == 28
    assert (_right(smollm2_survey, "subject", "3.1"), _right(smollm2_survey, "object", "3.1")) == (18, 0)
    first = smollm2_survey.sinks["first token"]
    assert [f"{x:.2f}" for x in first[:2]] == ["0.20", "0.18"] and (first[2:] > 0.5).sum() == 24
