"""A student's FlashAttention forward (`verify --module FILE:Name --impl tiled`), CS336 style: right
ones at several tile sizes are Right; each of the 13 tiled mistakes of tests/student/flash_zoo.py is
Wrong, named, at the line whose numbers went wrong and its tile. The walk the mistakes are written
against is checked first against the lecture's tiled attention and PyTorch's own attention."""

import json
import pathlib

import pytest
import torch
import torch.nn.functional as F

from mha_trace.analyses.tiled_mistakes import MISTAKES, tiled_forward
from mha_trace.analyses.tiled_student import reference
from mha_trace.core.attention import tiled_attention

ZOO = "tests/student/flash_zoo.py"


@pytest.mark.parametrize("causal", [False, True])
def test_the_walk_is_the_lectures_and_pytorchs_attention(causal):
    Q, K, V = (torch.randn(2, 48, 16, dtype=torch.float64) for _ in range(3))
    O_ref, L_ref = reference(Q, K, V, causal)
    assert torch.allclose(O_ref, F.scaled_dot_product_attention(Q, K, V, is_causal=causal), atol=1e-12)
    mask = torch.ones(48, 48, dtype=torch.bool).tril() if causal else None
    lecture = tiled_attention(Q[:, None], K[:, None], V[:, None], mask, 16, 8)
    for bq, bk in ((16, 8), (8, 16), (48, 48), (12, 20)):
        O, L = tiled_forward(Q, K, V, causal, bq, bk)
        assert torch.allclose(O, O_ref, atol=1e-12) and torch.allclose(L, L_ref, atol=1e-12)
    assert torch.allclose(lecture[0][:, 0], O_ref, atol=1e-12)


def test_each_mistake_of_the_zoo_changes_what_the_walk_gives():
    Q, K, V = (torch.randn(2, 64, 16, dtype=torch.float64) for _ in range(3))
    right = tiled_forward(Q, K, V, True, 16, 16)
    for m in MISTAKES:
        O, L = tiled_forward(Q, K, V, True, 16, 16, m.stages)
        assert not (torch.allclose(O, right[0], equal_nan=True) and torch.allclose(L, right[1], equal_nan=True)), m.name
    assert len(MISTAKES) >= 12


def _verify(cli, spec, *flags):
    result = cli("verify", "--module", f"{ZOO}:{spec}", "--impl", "tiled", *flags, "--format", "json")
    return result, json.loads(result.stdout) if result.stdout.strip() else None


@pytest.mark.parametrize("spec,blocks", [("FlashAttention", [16, 16]), ("Tiles8x32", [8, 32]),
                                         ("Tiles32x8", [32, 8]), ("flash_forward", [16, 16])])
@pytest.mark.parametrize("causal", [(), ("--mask", "causal")])
def test_a_right_tiled_forward_is_right_whatever_its_tiles(cli, spec, blocks, causal):
    result, data = _verify(cli, spec, *causal)
    assert result.exit_code == 0 and data["passed"] and data["blocks"] == blocks, result.stdout
    assert data["lse_max_abs_diff"] is not None  # L found: saved for the backward, or returned


BUGS = {  # class: (the mistake named, words of the line whose numbers went wrong, its query tile)
    "NoScale": ("the scores not scaled by 1/√d", "S = Q_i @ K_j.transpose", 1),
    "SkipDiagonal": ("the diagonal key tile skipped (causal skipping off by one)", "O[:, i:i + B_Q] =", 1),
    "NoTileMask": ("no causal mask inside the diagonal tile", "m_new = torch.maximum", 1),
    "MaskFlipped": ("the causal mask the wrong way round", "S = S.masked_fill", 1),
    "RescaleFlipped": ("the rescale the wrong way round: exp(m_new - m_old)", "alpha = ", 1),
    "LNotRescaled": ("the running sum ℓ not rescaled", "l = l + P.sum", 2),
    "SumAxis": ("the row sums taken over the queries (dim=-2)", "l = l + P.sum", 1),
    "TimesK": ("the tile's weights applied to K instead of V", "PV = P @", 1),
    "ONotRescaled": ("the output not rescaled", "O_i = O_i + PV", 2),
    "DivideEach": ("divided by ℓ at every tile", "O_i = O_i + PV", 1),
    "NoDivision": ("the final division by ℓ missing", "O_i = O_i + PV", None),
    "LseNoM": ("the logsumexp without m: L = log ℓ", "L[:, i:i + B_Q] =", None),
    "LseNoLog": ("the logsumexp without its log: L = m + ℓ", "L[:, i:i + B_Q] =", 1),
}


@pytest.mark.parametrize("spec", BUGS)
def test_each_tiled_mistake_is_wrong_named_at_its_line_and_tile(cli, spec):
    mistake, words, tile = BUGS[spec]
    result, data = _verify(cli, spec, "--mask", "causal")
    assert result.exit_code == 1 and not data["passed"]
    assert data["diagnosis"] == mistake and data["fix"]
    assert data["first_wrong_step"]["source"].startswith(words), data["first_wrong_step"]
    assert data["tile"] is not None and (tile is None or data["tile"][0] == tile), data["tile"]


def test_the_text_names_the_tile_the_line_and_the_fix(cli):
    text = " ".join(cli("verify", "--module", f"{ZOO}:LNotRescaled", "--impl", "tiled").stdout.split())
    assert "Its tiles: 16 query rows × 16 keys, read off its first score tile." in text
    assert "First wrong step, at query tile 1, key tile 2: line 34" in text
    assert "Diagnosis: the running sum ℓ not rescaled. Fix: rescale ℓ by exp(m_old - m_new)" in text


@pytest.mark.parametrize("args, words", [
    (["--module", f"{ZOO}:FlashAttention", "--impl", "tiled", "--heads", "2"], "--heads does not go with --impl tiled"),
    (["--module", "tests/student/student_bugs.py:Correct", "--impl", "tiled"], "is not a torch.autograd.Function or a function"),
])
def test_what_tiled_cannot_check_is_refused_in_one_line(cli, args, words):
    result = cli("verify", *args)
    assert result.exit_code == 2 and words in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_backward_when_written_is_checked_against_autograd(cli):
    """dQ, dK and dV of its backward for one dO, against autograd through attention computed whole;
    a backward that leaves D out of dS is Wrong for dQ and dK alone; one not written is said."""
    _, right = _verify(cli, "WithBackward", "--mask", "causal")
    assert right["passed"] and set(right["gradients"]) == {"dQ", "dK", "dV"}
    result, wrong = _verify(cli, "BackwardWithoutD", "--mask", "causal")
    assert result.exit_code == 1 and not wrong["passed"]
    assert {k for k, v in wrong["gradients"].items() if v["max_abs_diff"] > wrong["tolerance"]} == {"dQ", "dK"}
    text = " ".join(cli("verify", "--module", f"{ZOO}:BackwardWithoutD", "--impl", "tiled").stdout.split())
    assert "Its forward is right; its backward's dQ and dK differ from autograd's" in text
    _, forward_only = _verify(cli, "FlashAttention")
    assert forward_only["gradients"] == {} and any("not written yet" in n for n in forward_only["notes"])
    shipped = cli("verify", "--module", "examples/tiled/flash_cs336.py:FlashAttention", "--impl", "tiled",
                  "--mask", "causal").stdout
    assert shipped.startswith("verify: FlashAttention from examples/tiled/flash_cs336.py") and "dK (its backward)" in shipped


def test_a_class_of_tiled_forwards_is_graded(cli, tmp_path):
    """CS336's assignment graded for a class: each FlashAttention in a process of its own."""
    right = (pathlib.Path("examples") / "tiled" / "flash_cs336.py").read_text()
    (tmp_path / "alice.py").write_text(right)
    (tmp_path / "bob.py").write_text(right.replace("l = alpha * l + P.sum(dim=-1)", "l = l + P.sum(dim=-1)"))
    result = cli("verify", "--module", f"{tmp_path}/*.py:FlashAttention", "--impl", "tiled", "--mask", "causal",
                 "--format", "json")
    rows = {r["student"]: r for r in json.loads(result.stdout)["students"]}
    assert result.exit_code == 0 and rows["alice"]["verdict"] == "right"
    assert (rows["bob"]["verdict"], rows["bob"]["mistake"]) == ("wrong", "the running sum ℓ not rescaled")
    assert rows["bob"]["source"] == "l = l + P.sum(dim=-1)"
