"""survey --composition, train's K-composition partners and ablate on a trained run's induction
heads: every score against the full d_model × d_model products of the weights, written here in
NumPy from the modules' own tensors (Elhage et al. 2021's definitions, the row-vector convention)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
from slides import laid_out
import torch
from snapshots import differences

import mha_trace

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers


def direct(model, writer, reader) -> dict:
    """kind -> score, from full products of the two heads' matrices."""
    def mats(layer, h):
        a = model.attention_module(layer)
        norm = model.attention_norm_of(layer)
        w = np.ones(a.d_model) if norm is None else norm.weight.detach().double().numpy()
        d, g = a.d_k, (h - 1) // (a.heads // a.kv_heads)
        W = lambda lin, rows: lin.weight.detach().double().numpy()[rows].T * w[:, None]
        WQ = W(a.W_q, slice((h - 1) * d, h * d))
        WK, WV = (W(lin, slice(g * d, (g + 1) * d)) for lin in (a.W_k, a.W_v))
        WO = a.W_o.weight.detach().double().numpy()[:, (h - 1) * d:h * d].T
        return WQ @ WK.T, WV @ WO
    (_, OVa), (QKb, OVb) = mats(*writer), mats(*reader)
    n = np.linalg.norm
    return {"Q": n(OVa @ QKb) / (n(OVa) * n(QKb)), "K": n(OVa @ QKb.T) / (n(OVa) * n(QKb)),
            "V": n(OVa @ OVb) / (n(OVa) * n(OVb))}


def _guide_blocks(holding: str = "--composition") -> list[str]:
    """docs/why.md's text blocks that hold this: its two composition surveys (a saved run, and
    SmolLM2) by default."""
    text = (Path(__file__).parent.parent / "docs" / "why.md").read_text()
    return [b for b in re.findall(r"```text\n(.*?)```", text, re.S) if holding in b]


@pytest.fixture(scope="module")
def run(default_run):
    """The default run (its heads form by step 600), as saved and as `train` returned it."""
    from mha_trace.models import checkpoints

    return default_run, checkpoints.read_checkpoint(str(default_run))


def test_smollm2_scores_equal_full_products_under_gqa_and_rmsnorm():
    model = mha_trace.model("smollm2").model
    c = mha_trace.model("smollm2").composition()
    for writer, reader in [((1, 1), (2, 9)), ((3, 4), (4, 1)), ((18, 9), (19, 8)), ((17, 2), (30, 5))]:
        found = direct(model, writer, reader)
        for kind, value in found.items():
            got = c.scores[kind][c.heads.index(writer), c.heads.index(reader)]
            assert got == pytest.approx(value, rel=1e-5), (kind, writer, reader)
    assert np.isnan(c.scores["K"][c.heads.index((5, 1)), c.heads.index((5, 2))])  # same layer
    assert np.isnan(c.scores["K"][c.heads.index((6, 1)), c.heads.index((5, 2))])  # later writer
    assert c.baseline.mean() == pytest.approx(1 / np.sqrt(576), rel=0.03)  # random: about 1/√d_model
    assert differences(str(c), _guide_blocks()[1]) == []  # the guide shows it as it prints


def test_random_baseline_equals_random_full_products():
    from mha_trace.core.composition import random_baseline

    g = np.random.default_rng(1)
    n = np.linalg.norm
    full = []
    for _ in range(40):
        A = g.standard_normal((64, 16)) @ g.standard_normal((16, 64))
        B = g.standard_normal((64, 16)) @ g.standard_normal((16, 64))
        full.append(n(A @ B) / (n(A) * n(B)))
    assert random_baseline(64, 16).mean() == pytest.approx(np.mean(full), rel=0.05)


def test_a_trained_runs_induction_heads_read_its_previous_token_head(cli, run):
    path, trained = run
    data = json.loads(cli("survey", "--checkpoint", str(path), "--composition", "--format", "json").stdout)
    assert differences(cli("survey", "--checkpoint", str(path), "--composition").stdout,
                       _guide_blocks()[0]) == []
    why = cli("explain", "--checkpoint", str(path), "--position", "20", "--head", "2.3", "--why").stdout
    guide = _guide_blocks("Head 2.3, query")[0]  # the guide's induction score, split
    shown = why[why.index("Head 2.3, query"):]
    assert differences("\n".join(shown.splitlines()[:len(guide.splitlines())]) + "\n", guide) == []
    model = mha_trace.model(str(path)).model
    heads = [tuple(h) for h in data["heads"]]
    for kind in "QKV":
        for writer, reader in [((1, 1), (2, 1)), ((1, 4), (2, 3))]:
            value = data["scores"][kind][heads.index(writer)][heads.index(reader)]
            assert value == pytest.approx(direct(model, writer, reader)[kind], rel=1e-5)
    assert data["induction_heads"] and all(h["partner_is_previous_token"] for h in data["induction_heads"])
    final = {tuple(p["head"]): p["snapshots"][-1] for p in
             json.loads(trained.to_json())["k_partners"]}
    for h in data["induction_heads"]:  # train's last snapshot is the saved run
        assert final[tuple(h["head"])]["partner"] == h["k_partner"]
        assert final[tuple(h["head"])]["k_composition"] == pytest.approx(h["k_score"], abs=1e-5)


def test_ablating_the_partner_lowers_the_induction_score_as_zeroing_its_w_o_columns_does(cli, run):
    path, _ = run
    survey = json.loads(cli("survey", "--checkpoint", str(path), "--composition", "--format", "json").stdout)
    l, h = survey["induction_heads"][0]["k_partner"]
    result = json.loads(cli("ablate", "--checkpoint", str(path), "--head", f"{l}.{h}", "--format",
                            "json").stdout)
    model = mha_trace.model(str(path)).model
    ids = torch.tensor([model.tokenize(t) for t in model.probe_corpus.sentences])
    import copy

    toy = copy.deepcopy(model.toy)  # the loaded model stays as it is
    d = toy.blocks[0].d_k
    with torch.no_grad():
        toy.blocks[l - 1].W_o.weight[:, (h - 1) * d:h * d] = 0  # the head gone, another way
        _, _, weights = toy(ids)
    w = torch.stack(weights, 1).double().mean(0).numpy()
    n = w.shape[-1] // 2  # query n + j, the repeat of token j, looks at token j + 1
    by_hand = np.array([[np.mean([w[a, b, n + j, j + 1] for j in range(n)])
                         for b in range(w.shape[1])] for a in range(w.shape[0])])
    np.testing.assert_allclose(result["induction"]["without"], by_hand, atol=1e-9)
    before, after = np.array(result["induction"]["every_head"]), np.array(result["induction"]["without"])
    reader = survey["induction_heads"][0]["head"]
    assert after[reader[0] - 1, reader[1] - 1] < before[reader[0] - 1, reader[1] - 1] - 0.1


def test_an_encoder_a_single_layer_and_mixed_flags_are_refused(cli, tmp_path):
    one = tmp_path / "one.pt"
    mha_trace.train("previous-token", steps=5, snapshots=2, save=str(one))
    for args, message in [(("survey", "--checkpoint", str(one), "--composition"), "has one layer"),(("survey", "--model", "minilm", "--composition"), "post-norm"),
                          (("survey", "--model", "smollm2", "--composition", "--effect"),
                           "reads the weights alone")]:
        result = cli(*args)
        assert result.exit_code == 2 and message in result.stderr, result.stderr


def test_the_slide_shows_each_kind_as_a_multiple_of_random(cli, run, kept_slides):
    from mha_trace.render import composition_slide

    path, _ = run
    made = kept_slides(composition_slide)
    assert cli("survey", "--checkpoint", str(path), "--composition", "--png", "c.png").exit_code == 0
    laid_out(made[-1])
    axes = [ax for ax in made[-1].axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["Q-composition", "K-composition", "V-composition"]
    assert [t.get_text() for t in axes[1].get_xticklabels()] == ["2.1", "2.2", "2.3", "2.4"]
    data = json.loads(cli("survey", "--checkpoint", str(path), "--composition", "--format", "json").stdout)
    shown = axes[1].get_images()[0].get_array()  # K: rows 1.x write, columns 2.x read, × random
    heads = [tuple(h) for h in data["heads"]]
    assert shown[0, 2] == pytest.approx(data["scores"]["K"][heads.index((1, 1))][heads.index((2, 3))]
                                        / data["random"]["mean"], rel=1e-5)
    for ax, kind in zip(axes, "QKV"):  # the three strongest pairs circled where they are
        best = sorted(((x, (i, j)) for i, row in enumerate(data["scores"][kind])
                       for j, x in enumerate(row) if x is not None), reverse=True)[:3]
        rings = [tuple(np.round(ring.get_offsets()[0]).astype(int)) for ring in ax.collections]
        assert rings == [(heads[j][1] - 1, heads[i][1] - 1) for _, (i, j) in best], kind
        marks = [t.get_text() for t in ax.texts]
        assert marks[0] == f"1: {best[0][0] / data['random']['mean']:.1f}×", marks
    refused = cli("survey", "--model", "minilm", "--png", "x.png")
    assert refused.exit_code == 2 and "goes with --composition" in refused.stderr


def test_asking_for_more_pairs_than_a_run_has_lists_the_real_ones_only(cli, run):
    """A 2 × 4 run has 16 pairs of an earlier and a later head: --top 20 lists those 16, says so,
    and never a head with itself or a later writer (`1.1 → 1.1 nan`)."""
    path, _ = run
    shown = cli("survey", "--checkpoint", str(path), "--composition", "--top", "20").stdout
    assert "The 16 strongest pairs of each kind (earlier head → later head) (all 16 of them)" in shown
    assert "nan" not in shown and "\n17 " not in shown
