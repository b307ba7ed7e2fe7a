"""`explain --rope-planes`: each score as the sum of RoPE's rotation planes, checked against the
same config without RoPE turned by hand (the complex-number form of the rotation), and on
SmolLM2 against the walk's own scores."""

import json
import math

import numpy as np
import pytest

SENTENCE = "The cat sat on the mat because the cat"


def test_the_planes_are_the_unturned_pairs_turned_by_the_distance(cli):
    """q'·k' over plane i = (a·b) cos φ + (a₂b₁ − a₁b₂) sin φ, φ = (n − m)·θ_i, with a, b the pair
    of q and k before RoPE (the run without --rope) and m, n their positions."""
    planes = json.loads(cli("explain", "--config", "chicken-road", "--rope", "--token", "it", "--rope-planes", "--decimals", "10",
                            "--format", "json").stdout)
    plain = json.loads(cli("explain", "--config", "chicken-road", "--token", "it", "--decimals", "10",
                           "--format", "json").stdout)
    turned = json.loads(cli("explain", "--config", "chicken-road", "--rope", "--token", "it", "--decimals", "10",
                            "--format", "json").stdout)
    m, half = planes["position"], len(planes["planes"])
    thetas = 10000.0 ** (-np.arange(half) * 2 / (2 * half))
    assert [p["theta"] for p in planes["planes"]] == pytest.approx(thetas)
    for head, before, after in zip(planes["heads"], plain["heads"], turned["heads"]):
        a = np.array(before["query"])
        for n, key in enumerate(before["keys"]):
            b = np.array([k for _, k in key["products"]])
            phi = (n - m) * thetas
            by_hand = ((a[:half] * b[:half] + a[half:] * b[half:]) * np.cos(phi)
                       + (a[half:] * b[:half] - a[:half] * b[half:]) * np.sin(phi)) / math.sqrt(2 * half)
            assert [row[n] for row in head["parts"]] == pytest.approx(by_hand, abs=1e-9)
            assert sum(row[n] for row in head["parts"]) == pytest.approx(after["keys"][n]["scaled"], abs=1e-9)
            assert sum(row[n] for row in head["unturned"]) == pytest.approx(key["scaled"], abs=1e-9)


def test_the_planes_table_fits_and_says_what_the_frequency_belongs_to(cli, golden):
    text = cli("explain", "--config", "chicken-road", "--rope", "--token", "it", "--rope-planes", "--head", "2").stdout
    golden("explain_rope_planes_chicken.txt", text)
    assert "the frequency belongs to a pair of dims, not to a head" in " ".join(text.split())
    narrow = cli("explain", "--config", "chicken-road", "--rope", "--token", "it", "--rope-planes", "--width", "80")
    assert max(len(line) for line in narrow.stdout.splitlines()) <= 80


@pytest.mark.slow
def test_smollm2s_planes_add_up_to_its_scores(cli):
    data = json.loads(cli("explain", "--model", "smollm2", "--sentence", SENTENCE, "--token", "mat", "--head", "3.1",
                          "--rope-planes", "--decimals", "8", "--format", "json").stdout)
    walk = json.loads(cli("explain", "--model", "smollm2", "--sentence", SENTENCE, "--token", "mat", "--head", "3.1",
                          "--decimals", "8", "--format", "json").stdout)
    head, keys = data["heads"][0], walk["heads"][0]["keys"]
    assert len(data["planes"]) == 32 and data["rope_base"] == 100000.0
    seen = [j for j, k in enumerate(keys) if not k["masked"]]
    parts = np.array(head["parts"])
    assert parts[:, seen].sum(axis=0) == pytest.approx([keys[j]["scaled"] for j in seen], abs=1e-5)
    here = data["position"]  # the query's own key: both turned by the same angle, nothing changes
    assert parts[:, here] == pytest.approx(np.array(head["unturned"])[:, here], abs=1e-6)
    weights = np.exp(parts[:, seen].sum(axis=0))
    assert weights / weights.sum() == pytest.approx([keys[j]["weight"] for j in seen], abs=1e-5)


@pytest.mark.parametrize("args,message", [
    (("--rope-planes",), "--rope-planes splits scores that RoPE turned: add --rope (or a model with RoPE, such as smollm2)"),
    (("--rope", "--rope-planes", "--why"), "--rope-planes does not go with --why (the planes are shown alone)"),
    (("--rope", "--rope-planes", "--impl", "tiled"), "--rope-planes does not go with --impl tiled (it splits the explicit walk's scores)"),
])
def test_rope_planes_errors(cli, args, message):
    result = cli("explain", *args)
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")


@pytest.mark.slow
def test_a_survey_of_a_too_short_sentence_is_refused_in_one_line(cli):
    result = cli("survey", "--model", "smollm2", "--rope-planes", "--sentence", "Hi")
    assert (result.exit_code, result.stderr) == (2, "Error: --sentence: 'Hi' is only 1 token (Hi); a survey "
                                                    "scores each query's previous and next token, so it needs at least 3\n")


@pytest.mark.slow
def test_the_surveys_shares_are_explains_planes_summed_over_every_query(cli):
    """One sentence: a head's share of plane i is Σ over queries and the keys each sees of
    |part_i| (explain --rope-planes, query by query), over the same sum of every plane."""
    survey = json.loads(cli("survey", "--model", "smollm2", "--sentence", SENTENCE, "--rope-planes",
                            "--format", "json").stdout)
    plain = json.loads(cli("survey", "--model", "smollm2", "--sentence", SENTENCE, "--format", "json").stdout)
    total = np.zeros(32)
    for position in range(9):
        data = json.loads(cli("explain", "--model", "smollm2", "--sentence", SENTENCE, "--position", str(position),
                              "--head", "3.1", "--rope-planes", "--decimals", "10", "--format", "json").stdout)
        head = data["heads"][0]
        seen = [j for j, masked in enumerate(head["masked"]) if not masked]
        total += np.abs(np.array(head["parts"])[:, seen]).sum(axis=1)
    assert survey["plane_shares"][2][0] == pytest.approx(total / total.sum(), abs=1e-4)
    assert np.array(survey["plane_shares"]).sum(-1) == pytest.approx(np.ones((30, 9)), abs=2e-3)  # 32 rounded shares
    text = cli("survey", "--model", "smollm2", "--sentence", SENTENCE, "--rope-planes", "--width", "80").stdout
    assert max(len(line) for line in text.splitlines()) <= 80 and "Spearman ρ" in text
    grid = next(b for b in plain["behaviours"] if b["name"] == "previous token")["scores"]
    assert np.array(survey["previous_token"]) == pytest.approx(np.array(grid), abs=1e-4)


@pytest.mark.slow
def test_on_the_corpus_smollm2s_previous_token_heads_lean_on_the_fastest_planes(cli):
    """Barbero et al. 2025, checked: the fastest quarter of the planes carries more of the
    previous-token heads' |q·k| than of the median head's; the guide shows this very run."""
    from pathlib import Path

    data = json.loads(cli("survey", "--model", "smollm2", "--rope-planes", "--format", "json").stdout)
    previous, fast = np.array(data["previous_token"]), np.array(data["band_shares"])[..., 0]
    assert data["spearman_previous_vs_fastest_band"] >= 0.5
    assert (fast[previous >= 0.5] > np.median(fast)).all() and (previous >= 0.5).sum() >= 3
    assert np.array(data["band_shares"]).max() < 0.9  # no head on one band alone
    guide = " ".join((Path(__file__).parent.parent / "docs" / "modern.md").read_text().split())
    assert f"Spearman ρ = {data['spearman_previous_vs_fastest_band']:.2f}" in guide
    assert f"give the fastest band {fast[previous >= 0.5].min():.0%}–{fast[previous >= 0.5].max():.0%}" in guide
    for i in np.argsort(-previous.ravel(), kind="stable")[:5]:  # the table's rows, as the guide shows them
        layer, head = divmod(int(i), 9)
        row = f"{layer + 1}.{head + 1} {previous[layer, head]:.3f} " + " ".join(
            f"{x:.0%}" for x in np.array(data["band_shares"])[layer, head])
        assert row in guide


def test_the_rope_slide_maps_every_planes_part(cli, kept_slides):
    from mha_trace.render import rope_slide

    made = kept_slides(rope_slide)
    args = ("explain", "--config", "chicken-road", "--rope", "--token", "it", "--rope-planes", "--head", "2")
    data = json.loads(cli(*args, "--format", "json").stdout)
    assert cli(*args, "--png", "x.png").exit_code == 0
    (fig,) = made
    assert tuple(fig.get_size_inches() * fig.dpi) == (1920, 1080)
    shown = [label.get_text().split("\n")[0] for label in fig.axes[0].get_xticklabels()]
    columns = [data["tokens"].index(token) for token in shown]
    parts = np.array(data["heads"][0]["parts"])[:, columns]
    assert np.asarray(fig.axes[0].images[0].get_array()) == pytest.approx(parts, abs=1e-4)
    assert cli("explain", "--config", "chicken-road", "--rope", "--rope-planes", "--png", "x.png").stderr == (
        "Error: --png: the slide shows at most 4 heads: pick one with --head (e.g. --head 1)\n")


@pytest.mark.slow
def test_a_run_trained_with_rope_splits_by_plane_too(cli, tmp_path):
    """`train --rope`: RoPE in every layer and no learned positions; its walks split by plane add
    up to its own scores, and its survey by plane covers every head."""
    import torch

    from mha_trace.models.trained import Trained

    run = tmp_path / "rope.pt"
    assert cli("train", "--rope", "--steps", "60", "--snapshots", "2", "--save", str(run)).exit_code == 0
    model = Trained(str(run), None)
    assert model.capabilities.rope and model.rope_base == 10000.0 and model.toy.position is None
    assert all(block.rope for block in model.toy.blocks)
    planes = json.loads(cli("explain", "--checkpoint", str(run), "--head", "2.1", "--position", "20",
                            "--rope-planes", "--decimals", "10", "--format", "json").stdout)
    walk = json.loads(cli("explain", "--checkpoint", str(run), "--head", "2.1", "--position", "20",
                          "--decimals", "10", "--format", "json").stdout)
    keys = walk["heads"][0]["keys"]
    seen = [j for j, k in enumerate(keys) if not k["masked"]]
    sums = np.array(planes["heads"][0]["parts"]).sum(axis=0)
    assert sums[seen] == pytest.approx([keys[j]["scaled"] for j in seen], abs=1e-8)
    # the walk's own scores against the trained model's attention, recomputed here from its weights
    ids = torch.tensor([[int(t) for t in model.default_text.split()]])
    _, inputs, weights = model.toy(ids)
    assert [keys[j]["weight"] for j in seen] == pytest.approx(weights[1][0, 0, 20, :21].tolist(), abs=1e-6)
    survey = json.loads(cli("survey", "--checkpoint", str(run), "--rope-planes", "--format", "json").stdout)
    assert np.array(survey["band_shares"]).shape == (2, 4, 4)
    # the cache lab runs h2o a layer at a time, replaying its cache's evictions: with room for
    # every token that is the loss of one whole pass
    lab = json.loads(cli("cache", "--checkpoint", str(run), "--budget", "32", "--format", "json").stdout)
    logits, _, _ = model.toy(ids)
    whole = torch.nn.functional.cross_entropy(logits[0, :-1], ids[0, 1:]).item()
    h2o = next(r for r in lab["results"] if r["policy"] == "h2o")
    assert h2o["how"] == "replayed" and h2o["nll"] == pytest.approx(whole, abs=1e-5)
