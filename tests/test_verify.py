"""`verify`: passes on the real module, fails (exit 1) on a wrong one."""

import json

import pytest

import mha_trace.runs.run as run_module
from mha_trace.core.attention import MultiHeadAttention


@pytest.mark.parametrize("args", [
    (),
    ("--heads", "8", "--kv-heads", "2", "--mask", "causal", "--dtype", "float64"),
    ("--mask", "causal", "--pad", "2", "--dtype", "bfloat16", "--d-model", "64"),
    ("--config", "cat-sat-on-mat", "--dtype", "float64"),
    ("--config", "animal-street"),
])
def test_verify_passes(cli, args):
    result = cli("verify", "--format", "json", *args)
    assert result.exit_code == 0, result.stdout
    data = json.loads(result.stdout)
    assert data["passed"] is True
    measured = [c for c in data["checks"] if c["max_abs_diff"] is not None]
    assert len(measured) >= 3 and all(c["max_abs_diff"] <= c["tolerance"] for c in measured)
    sdpa_weights = next(c for c in data["checks"] if c["reference"].startswith("F.scaled")
                        and c["compares"] == "per-head weights")
    assert sdpa_weights["passed"] is None and "only the output" in sdpa_weights["note"]


def test_gqa_notes_that_nn_multihead_attention_cannot_compare(cli):
    data = json.loads(cli("verify", "--kv-heads", "2", "--format", "json").stdout)
    mha = [c for c in data["checks"] if c["reference"] == "nn.MultiheadAttention"]
    assert [c["passed"] for c in mha] == [None] and "grouped-query" in mha[0]["note"]


def test_a_wrong_module_fails_with_exit_1(cli, monkeypatch):
    class Off(MultiHeadAttention):
        def forward(self, q, k=None, v=None, mask=None):
            out, weights = super().forward(q, k, v, mask)
            return out * 1.001, weights

    monkeypatch.setattr(run_module, "MultiHeadAttention", Off)
    result = cli("verify")
    assert result.exit_code == 1
    assert "FAIL" in result.stdout and "Some comparisons FAIL (exit code 1)." in result.stdout


def test_verify_on_meta_is_refused(cli):
    result = cli("verify", "--device", "meta")
    assert result.exit_code == 2
    assert result.stderr == "Error: --device: verify compares numbers, and the meta device holds none (use cpu or cuda)\n"


def test_verify_refuses_sizes_that_do_not_fit(cli):
    result = cli("verify", "--seq", "200000", "--heads", "32", "--d-model", "1024")
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: this run needs about ")
    assert result.stderr.endswith("(verify on smaller sizes: the check does not depend on them)\n")


def test_verify_applies_config_overrides(cli):
    data = json.loads(cli("verify", "--config", "cat-sat-on-mat", "--heads", "4", "--mask", "causal",
                          "--format", "json").stdout)
    assert data["passed"] is True
    assert data["description"] == "config cat-sat-on-mat: 5 tokens, d_model=4 heads=4 mask=causal"


def test_verify_refuses_flag_sizes_beside_a_config(cli):
    result = cli("verify", "--config", "cat-sat-on-mat", "--seq", "8")
    assert result.exit_code == 2
    assert result.stderr == ("Error: --seq goes with sizes from flags; a config fixes its tokens, "
                             "width and seed\n")


def test_verify_json_states_what_ran_as_keys(cli):
    """Scripts read the heads and the mask as keys, as for every other command, not from the
    description sentence."""
    data = json.loads(cli("verify", "--config", "cat-sat-on-mat", "--heads", "4", "--mask", "causal",
                          "--format", "json").stdout)
    assert (data["config"], data["heads"], data["mask"], data["d_model"], data["seq"]) == \
        ("cat-sat-on-mat", 4, "causal", 4, 5)
    sizes = json.loads(cli("verify", "--heads", "8", "--kv-heads", "2", "--seq", "6", "--format",
                           "json").stdout)
    assert (sizes["config"], sizes["heads"], sizes["kv_heads"], sizes["seq"], sizes["seed"]) == \
        (None, 8, 2, 6, 0)
