"""`ablate --prune`: Michel et al.'s head importance against finite differences, the corpus loss
against a next-token loss computed by hand, and the command on a small corpus.

The full run (the bundled corpus, 13 points of the curve) takes about 45 seconds: bench/ times it.
"""

import json

import numpy as np
import pytest
import torch

from mha_trace.models import corpus

from mha_trace.analyses import pruning
from mha_trace.models import load_model

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

SENTENCES = ["The cat sat on the mat.", "Where did you leave the keys?",
             "Bees carry pollen from one flower to another."]


@pytest.fixture(scope="module")
def model():
    m = load_model("smollm2")
    with m.resident():  # dequantised once for the module, as prune() does
        yield m


def _loss_by_hand(model, text: str, removed=()) -> tuple[float, int]:
    """(the summed next-token loss in nats, how many tokens) from the model's logits, with numpy's
    log-sum-exp, the heads removed through ablate's own mechanism."""
    from mha_trace.analyses.model_analysis import _run_with

    ids = model.tokenize(text)
    plan = {}
    for layer, head in removed:
        plan.setdefault(layer, []).append((None, head))
    hidden = _run_with(model, ids, plan)
    logits = model.logits_at(hidden, slice(0, len(ids) - 1)).double().numpy()
    top = logits.max(1, keepdims=True)
    logz = (top + np.log(np.exp(logits - top).sum(1, keepdims=True)))[:, 0]
    return float(sum(logz[p] - logits[p, ids[p + 1]] for p in range(len(ids) - 1))), len(ids) - 1


REMOVED = [(), ((3, 2), (3, 5), (17, 1)), tuple((l, h) for l in (1, 2) for h in range(1, 10))]


def test_corpus_losses_are_the_mean_next_token_loss_of_each_set_of_removed_heads(model):
    found = pruning.batches(model, SENTENCES, 1024)
    ours = pruning.corpus_losses(model, found, [list(r) for r in REMOVED])
    for removed, loss in zip(REMOVED, ours):
        total, count = map(sum, zip(*(_loss_by_hand(model, s, removed) for s in SENTENCES)))
        assert loss == pytest.approx(total / count, abs=1e-4)


def test_the_curves_points_share_passes_and_keep_their_own_heads(model, monkeypatch):
    """Points decoded together, as many a pass as fit, equal each point alone: a row's gates are
    its own point's (a pass of 2 points and one of 1 here; all 3 points in one pass, and alone)."""
    found = pruning.batches(model, SENTENCES, 1024)
    alone = [pruning.corpus_losses(model, found, [list(r)])[0] for r in REMOVED]  # a pass each
    for tokens in (1024, 2 * max(len(r) * len(r[0]) for r in found)):
        monkeypatch.setattr(pruning, "PASS_TOKENS", tokens)
        together = pruning.corpus_losses(model, found, [list(r) for r in REMOVED])
        np.testing.assert_allclose(together, alone, rtol=1e-5)  # float32 sums of other shapes
    assert len(set(np.round(alone, 3))) == 3  # three different curves' points


def test_importance_is_the_gradient_of_the_loss_for_each_heads_gate(model):
    """One layer's scores against central differences: scaling a head's output by 1 ± ε changes
    the loss by about ±ε ∂L/∂ξ. Michel et al. normalise each layer, so the ratios are compared.
    ε is large enough that float32's rounding of the loss (about 1e-6) stays under 1e-4 of it."""
    text, layer, eps = SENTENCES[0], 4, 1e-2
    ids = model.tokenize(text)

    def loss(head, gate):
        gates = [torch.ones(1, model.heads) for _ in range(model.layers)]
        gates[layer - 1][0, head] = gate
        with torch.no_grad():
            return float(pruning._sentence_losses(model, [ids], gates).double()[0])

    by_hand = np.abs([(loss(h, 1 + eps) - loss(h, 1 - eps)) / (2 * eps) for h in range(model.heads)])
    ours, _ = pruning.importance(model, [text])
    np.testing.assert_allclose(ours[layer - 1], by_hand / np.linalg.norm(by_hand), atol=0.005)
    assert np.linalg.norm(ours, axis=1) == pytest.approx(1.0)


def test_how_many_heads_can_go_reads_the_curve():
    p = pruning.Pruning(None, "c", 10, np.zeros((1, 4)), [(1, h) for h in range(1, 5)],
                        [(0, 4.0), (1, 4.1), (2, 4.3), (3, 4.1), (4, 5.0)])
    assert p.can_go(0.05) == (1, 2)  # 4.3 is 7.5% over: the first point over 5%
    assert p.can_go(0.10) == (3, 4)
    assert p.can_go(1.0) == (4, None)


def test_prune_command_on_a_small_corpus(cli, tmp_path, monkeypatch, model):
    from PIL import Image

    small = corpus.Corpus("3 sentences", SENTENCES)
    monkeypatch.setattr(corpus, "bundled", lambda: small)
    monkeypatch.setattr(pruning, "FRACTIONS", (0, 0.5, 1))
    png = tmp_path / "curve.png"
    result = cli("ablate", "--model", "smollm2", "--prune", "--format", "json", "--png", str(png))
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert [p["removed"] for p in data["points"]] == [0, 135, 270] and data["heads"] == 270
    found = pruning.batches(model, SENTENCES, 1024)
    assert data["points"][0]["loss"] == pytest.approx(pruning.corpus_losses(model, found, [[]])[0], abs=1e-5)
    order = [(o["layer"], o["head"]) for o in data["order"]]
    assert sorted(order) == [(l, h) for l in range(1, 31) for h in range(1, 10)]
    scores = [o["importance"] for o in data["order"]]
    assert scores == sorted(scores)  # least important first
    assert data["points"][-1]["loss"] > data["points"][0]["loss"]  # no attention at all: worse
    assert Image.open(png).size == (1920, 1080) and result.stderr.startswith(f"Wrote {png} (")
    text = cli("ablate", "--model", "smollm2", "--prune").stdout
    assert "on 3 sentences" in text and "Michel et al. 2019" in text


@pytest.mark.parametrize("args, message", [
    (("--model", "minilm", "--prune"), "Error: --prune: pruning measures the next-token loss, and "
     "all-MiniLM-L6-v2 is an encoder with no next token (try --model smollm2)"),
    (("--prune",), "Error: --prune goes with --model (e.g. --model smollm2)"),
    (("--model", "smollm2", "--prune", "--rank"), "Error: choose one of --head, --rank and --prune"),
    (("--model", "smollm2", "--head", "1.1", "--png", "x.png"),
     "Error: --png draws the pruning curve: it goes with --model smollm2 --prune"),
    (("--model", "smollm2", "--prune", "--sentence", "Hello there friend"),
     "Error: --prune runs on the bundled corpus, not on one sentence or layer"),
])
def test_prune_refusals(cli, args, message):
    result = cli("ablate", *args)
    assert result.exit_code == 2 and result.stderr == message + "\n"
