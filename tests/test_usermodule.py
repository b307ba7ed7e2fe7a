"""--module: the seeds' own implementations, traced as written, and the student's mistakes."""

import json
from pathlib import Path

import numpy as np
import pytest

EX = "examples/"
SEEDS = {  # spec: (forward call, what it returns)
    EX + "l04_mha.py:MultiHeadAttention": ("forward(q, k, v)", "output [2, 5, 64] (no weights)"),
    EX + "committee_mha.py:MultiHeadAttention": ("forward(x)", "output [2, 5, 64] and weights [2, 4, 5, 5]"),
    EX + "raschka_mha.py:MultiHeadAttention": ("forward(Q, K, V)", "output [2, 5, 64] and weights [2, 4, 5, 5]"),
    EX + "reference_sheet_mha.py:MultiHeadAttention": ("forward(x)", "output [2, 5, 64] (no weights)"),
    EX + "chapter_torch_mha.py:MultiHeadAttention": ("forward(Q, K, V)", "output [2, 5, 64] and weights [2, 4, 5, 5]"),
    EX + "nanogpt_attention.py:CausalSelfAttention": ("forward(x)", "output [2, 5, 64] (no weights)"),
    "torch.nn:MultiheadAttention": ("forward(query, key, value)", "output [2, 5, 64] and weights [2, 5, 5]"),
}


def shapes(cli, spec, *extra):
    return cli("shapes", "--module", spec, "--d-model", "64", "--heads", "4", "--seq", "5", *extra)


@pytest.mark.parametrize("spec", sorted(SEEDS))
def test_every_seed_implementation_traces_as_written(cli, spec):
    result = shapes(cli, spec)
    assert result.exit_code == 0, result.stderr
    call, returned = SEEDS[spec]
    assert f", {call}: batch=2 seq=5 d_model=64 heads=4" in result.stdout.replace("\n", " ")
    assert f"forward returned {returned}." in result.stdout


def test_seed_module_reproduces_the_l04_order(cli):
    data = json.loads(shapes(cli, EX + "l04_mha.py:MultiHeadAttention", "--format", "json").stdout)
    ops = [s["op"] for s in data["steps"]]
    assert ops == ["input", "linear", "view", "transpose", "linear", "view", "transpose", "linear",
                   "view", "transpose", "transpose", "matmul", "div", "softmax", "matmul",
                   "transpose", "contiguous", "view", "linear"]
    assert all(s["file"] == "examples/l04_mha.py" for s in data["steps"])


def test_module_level_helper_rows_come_from_the_users_file(cli):
    data = json.loads(shapes(cli, EX + "committee_mha.py:MultiHeadAttention", "--format", "json").stdout)
    start = next(n for n, line in enumerate(open("examples/committee_mha.py"), 1)
                 if line.startswith("def scaled_dot_product_attention"))
    helper = [s for s in data["steps"] if s["line"] > start]
    assert [s["op"] for s in helper] == ["transpose", "matmul", "div", "softmax", "matmul"]
    softmax = next(s for s in helper if s["op"] == "softmax")
    # F.softmax runs inside torch.nn.functional; the row belongs to the user's line that called it
    assert softmax["file"] == "examples/committee_mha.py"
    assert softmax["text"] == "F.softmax(scaled_scores, dim=-1)"


def test_fused_paths_are_named(cli):
    out = shapes(cli, EX + "nanogpt_attention.py:CausalSelfAttention", "--width", "160").stdout
    assert "scaled_dot_product_attention" in out and "the weights are never formed" in out
    assert ".split(self.n_embd, dim=2)" in out
    out = shapes(cli, "torch.nn:MultiheadAttention").stdout
    assert "multi_head_attention_forward" in out and "per-op detail is hidden" in out


def test_mask_reaches_the_users_forward(cli):
    data = json.loads(shapes(cli, EX + "raschka_mha.py:MultiHeadAttention", "--mask", "causal",
                             "--format", "json").stdout)
    assert "masked_fill" in [s["op"] for s in data["steps"]]
    result = shapes(cli, EX + "reference_sheet_mha.py:MultiHeadAttention", "--mask", "causal")
    assert result.exit_code == 2
    assert result.stderr == ("Error: --mask: MultiHeadAttention.forward takes no mask argument, so "
                             "no causal or padding mask can be applied\n")


def test_init_for_other_parameter_names(cli, tmp_path):
    path = tmp_path / "odd.py"
    path.write_text("import torch.nn as nn\n\nclass Odd(nn.Module):\n"
                    "    def __init__(self, width, count, dropout):\n"
                    "        super().__init__()\n        self.p = nn.Linear(width, width)\n"
                    "    def forward(self, x):\n        return self.p(x)\n")
    result = cli("shapes", "--module", f"{path}:Odd", "--d-model", "8", "--heads", "2")
    assert result.exit_code == 2
    assert result.stderr == ("Error: cannot build Odd(width, count, dropout): no value for 'width', "
                             "'count' (give every argument with --init 'name=value, ...')\n")  # dropout: 0.1
    ok = cli("shapes", "--module", f"{path}:Odd", "--d-model", "8", "--heads", "2",
             "--init", "width=8, count=2, dropout=0.1")
    assert ok.exit_code == 0 and "self.p(x)" in ok.stdout


def test_failing_forward_shows_the_trace_and_the_failing_line(cli):
    result = shapes(cli, EX + "broken_view.py:MultiHeadAttention")
    assert result.exit_code == 1
    out = result.stdout
    assert "(weights @" in out and "transpose" in out  # the trace up to the failure
    tail = out[out.index("forward raised at"):].splitlines()
    assert tail[0] == "forward raised at examples/broken_view.py:22"
    assert tail[1].strip().startswith("context = (weights @ v).transpose(1, 2).view(B, T, D)")
    assert tail[2] == "op: view (.view(B, T, D))"
    assert tail[3] == "input shapes: [2, 5, 4, 16]"
    assert tail[4].startswith("torch says: view size is not compatible with input tensor's size")
    assert "Traceback" not in out + result.stderr


def test_shape_mismatch_names_both_inputs(cli):
    result = cli("shapes", "--module", EX + "l04_mha.py:MultiHeadAttention", "--d-model", "64",
                 "--heads", "4", "--init", "d_model=32, num_heads=4")
    assert result.exit_code == 1
    assert "op: linear (self.W_q(q))" in result.stdout
    assert "input shapes: [2, 10, 64], [32, 32], [32]" in result.stdout
    assert "hint: the inner dimensions differ" in result.stdout


@pytest.mark.parametrize("spec,message", [
    ("nope.py:X", "--module nope.py: not found"),
    ("examples/l04_mha.py:Nope", "--module examples/l04_mha.py:Nope: no class 'Nope' in "
                                 "examples/l04_mha.py (nn.Module classes there: MultiHeadAttention)"),
    ("examples/l04_mha.py:math", "--module examples/l04_mha.py:math: math is neither a torch.nn.Module "
                                 "subclass nor a class with a forward or __call__ method (a NumPy implementation)"),
    ("examples/l04_mha.py", "--module examples/l04_mha.py: expected FILE.py:ClassName or "
                            "package.module:ClassName"),
    ("no_such_package_xyz:Thing", "--module no_such_package_xyz: cannot import it (No module named "
                                  "'no_such_package_xyz')"),
])
def test_bad_module_specs(cli, spec, message):
    result = cli("shapes", "--module", spec)
    assert result.exit_code == 2
    assert result.stderr == f"Error: {message}\n"


def test_heads_uses_the_modules_own_weights(cli):
    import torch

    data = json.loads(cli("heads", "--module", EX + "committee_mha.py:MultiHeadAttention",
                          "--d-model", "8", "--heads", "2", "--format", "json",
                          "--decimals", "8").stdout)
    weights = np.array([h["weights"] for h in data["heads"]])
    assert weights.shape == (2, 5, 5)
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-7)
    # the same module, built the same way, run directly
    from mha_trace.runs.usermodule import load_user_class

    torch.manual_seed(0)
    module, _, _ = load_user_class(EX + "committee_mha.py:MultiHeadAttention", 8, 2, None,
                        torch.device("cpu"), torch.float64)
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    _, direct = module(x)
    np.testing.assert_allclose(weights, direct[0].detach().numpy(), atol=1e-8)


def test_heads_says_when_the_module_returns_no_weights(cli):
    result = cli("heads", "--module", EX + "reference_sheet_mha.py:MultiHeadAttention")
    assert result.exit_code == 1
    assert result.stderr == ("Error: MultiHeadAttention from examples/reference_sheet_mha.py returns "
                             "no attention weights (only its output), so there is nothing for heads "
                             "to show; mha-trace shapes --module still traces it\n")


def test_weights_first_order_is_recognised(cli):
    out = cli("heads", "--module", EX + "chapter_torch_mha.py:MultiHeadAttention", "--d-model",
              "4", "--heads", "2").stdout
    assert "Head 2 of 2" in out and "Output" in out


def test_explain_with_a_module_walks_its_returned_weights(cli):
    spec = EX + "committee_mha.py:MultiHeadAttention"
    heads = json.loads(cli("heads", "--module", spec, "-d", "8", "-H", "2", "-f", "json").stdout)
    walk = json.loads(cli("explain", "--module", spec, "-d", "8", "-H", "2", "--token", "sat",
                          "-f", "json").stdout)
    assert walk["token"] == "sat" and walk["position"] == 2
    assert [h["weights"] for h in walk["heads"]] == [h["weights"][2] for h in heads["heads"]]
    assert walk["output"] == heads["output"][2]
    out = cli("explain", "--module", spec, "-d", "8", "-H", "2", "--token", "sat").stdout
    assert "cannot be written out" in " ".join(out.split())


def test_d_model_without_module_is_refused(cli):
    result = cli("explain", "--d-model", "8")
    assert result.exit_code == 2
    assert result.stderr == "Error: --d-model goes with --module (a config's width is fixed by the config)\n"


def test_the_chapters_class_on_the_chapters_config_gives_the_chapters_numbers(cli):
    """The config's Q, K, V go in as forward(Q, K, V) with projections off: 0.1237, not 0.1361."""
    for spec, how in [("examples/chapter_torch_mha.py:MultiHeadAttention", "projections off"),
                      ("example:raschka", "its 4 projections set to the identity")]:
        data = json.loads(cli("heads", "--module", spec, "--config", "cat-sat-on-mat",
                              "--format", "json").stdout)
        assert how in data["source"]["fed"]
        assert [round(x, 4) for x in data["heads"][0]["weights"][0]] == [0.1237, 0.2509, 0.2509, 0.1237, 0.2509]
        ours = json.loads(cli("heads", "--format", "json").stdout)
        assert [h["weights"] for h in data["heads"]] == [h["weights"] for h in ours["heads"]]
    walk = cli("explain", "--module", "example:chapter_torch", "--config", "cat-sat-on-mat",
               "--token", "cat").stdout
    assert "0.3664" in walk


def test_a_one_input_module_on_an_explicit_config_says_what_it_was_fed(cli):
    data = json.loads(cli("heads", "--module", "example:committee", "--config", "cat-sat-on-mat",
                          "--format", "json").stdout)
    assert data["source"]["fed"].startswith("forward takes one input, so the config's separate Q, K, V cannot be fed")


def test_fused_projections_cannot_be_set_to_the_identity(cli):
    result = cli("heads", "--module", "example:nanogpt", "--config", "cat-sat-on-mat", "--heads", "2")
    assert result.exit_code in (1, 2) and result.stderr.startswith("Error: ")


def test_examples_are_listed_and_run_by_name(cli):
    data = json.loads(cli("examples", "--format", "json").stdout)
    names = {e["name"] for e in data["examples"]}
    assert names == {"broken_view", "chapter_numpy", "chapter_torch", "committee", "l04", "nanogpt",
                     "raschka", "reference_sheet", "rope_pairs"}
    by_name = cli("shapes", "--module", "example:l04", "--d-model", "64", "--heads", "4", "--format", "json")
    by_path = cli("shapes", "--module", "examples/l04_mha.py:MultiHeadAttention", "--d-model", "64",
                  "--heads", "4", "--format", "json")
    assert [s["shape"] for s in json.loads(by_name.stdout)["steps"]] == \
        [s["shape"] for s in json.loads(by_path.stdout)["steps"]]
    assert cli("shapes", "--module", "example:nope").stderr.startswith(
        "Error: --module example:nope: no bundled example 'nope' (examples: broken_view, ")


def test_every_example_named_in_help_exists():
    import re

    import typer

    from mha_trace.runs.bundled import examples
    from mha_trace.cli import app

    names = {e.name for e in examples()} | {e.path.stem for e in examples()}
    command = typer.main.get_command(app)
    helps = [p.help or "" for c in command.commands.values() for p in c.params] + [
        c.help or "" for c in command.commands.values()]
    for text in helps:
        for name in re.findall(r"example:([a-z0-9_]+)", text):
            assert name in names, name
        for path in re.findall(r"examples/([a-z0-9_]+\.py)", text):
            assert (Path("examples") / path).exists(), path
