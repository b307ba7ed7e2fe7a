"""`mha-trace train`: heads specialise from scratch, identical heads stay identical, a resumed run
equals an uninterrupted one, and a saved run is a model every view reads.

Runs are kept small (a few hundred steps, one thread) but each is a setting that does learn: the
numbers asserted are what those settings reach, with margin.
"""

import json

import numpy as np
import pytest
import torch

from mha_trace.models import checkpoints, training
from mha_trace.models.training import Spec, run_training

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the command runs: deterministic, and quicker at this size
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def induction_run(default_run):
    return checkpoints.read_checkpoint(str(default_run))  # `mha-trace train`: induction, 600 steps


def test_induction_heads_form_in_layer_two_and_the_loss_falls_far_below_chance(induction_run):
    r = induction_run
    last = r.snapshots[-1]
    assert last.loss < r.chance / 2  # chance: ln 16 = 2.77
    assert last.scores["induction"][1].max() > 0.5  # a head of layer 2
    assert last.scores["previous token"][0].max() > 0.4  # its partner below, forming
    formed = r.formed("induction")
    assert formed and min(formed.values()) > 100  # a phase change, not there from the start
    first, _ = min(formed.items(), key=lambda x: x[1])
    assert first[0] == 2


def test_snapshots_are_log_spaced_and_dense_early():
    steps = training.snapshot_steps(Spec.of("induction"))
    assert steps[0] == 0 and steps[-1] == 600 and len(steps) >= 18
    assert steps[5] < 10 and np.all(np.diff(steps) > 0)


def test_a_previous_token_head_forms_on_its_task():
    r = run_training(Spec.of("previous-token", steps=150))
    assert r.snapshots[-1].scores["previous token"].min() > 0.6  # every head, a third of the way
    assert r.snapshots[-1].loss < 0.5 and r.snapshots[0].loss > r.chance


def test_identical_heads_stay_identical_to_the_last_bit(train_once):
    """Exercise 3, on the guide's two runs (trained once for the whole run: test_readme checks
    their real output, what identical heads cost on the difference task)."""
    same = train_once(Spec.of("difference", steps=700, snapshots=4, identical_heads=True))
    distinct = train_once(Spec.of("difference", steps=700, snapshots=4))
    assert same.identical() and not distinct.identical()
    state = same.state["model"]
    d_k = same.spec.d_model // same.spec.heads
    for name in ("blocks.0.W_q.weight", "blocks.0.W_k.weight", "blocks.0.W_v.weight"):
        assert torch.equal(state[name][:d_k], state[name][d_k:]), name
    assert torch.equal(state["blocks.0.W_o.weight"][:, :d_k], state["blocks.0.W_o.weight"][:, d_k:])
    assert np.all(same.spread() == 0) and distinct.spread().min() > 0


TRAIN_40_STEPS = """
import torch
from mha_trace.models import training

torch.set_num_threads(1)
run = training.run_training(training.Spec.of("induction", steps=40, snapshots=2))
torch.save(run.state["model"], path)
"""


def test_a_run_is_the_same_on_another_cpus_kernels(tmp_path):
    """torch picks its float32 kernels by CPU (AVX-512, AVX2, plain): the same run trained with
    the plain kernels and with this CPU's must agree to float32 noise, every weight, the key
    biases included. They once drifted apart by ~1e-3 in 40 steps (AdamW turned the rounding noise
    that is a key bias's whole gradient into steps), and a trained run's scores in the guide
    differed by CPU."""
    import os
    import subprocess
    import sys

    train = lambda name: f"path = {str(tmp_path / name)!r}\n{TRAIN_40_STEPS}"
    env = {k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"}
    plain_run = subprocess.Popen([sys.executable, "-c", train("plain.pt")],
                                 env=env | {"ATEN_CPU_CAPABILITY": "default"})  # the plain kernels
    assert "ATEN_CPU_CAPABILITY" not in os.environ  # here, while it trains: this CPU's own
    before = torch.get_num_threads()
    try:
        exec(train("own.pt"), {})
    finally:
        torch.set_num_threads(before)
    assert plain_run.wait(timeout=120) == 0
    plain, own = torch.load(tmp_path / "plain.pt"), torch.load(tmp_path / "own.pt")
    far = {k: float((plain[k] - own[k]).abs().max()) for k in plain if
           float((plain[k] - own[k]).abs().max()) > 5e-5}
    assert far == {}


def test_key_biases_stay_as_initialised_and_the_weights_do_not_depend_on_them():
    run = run_training(Spec.of("induction", steps=5, snapshots=2))
    torch.manual_seed(0)
    start = training.Toy(run.spec).state_dict()
    trained = run.state["model"]
    assert all(torch.equal(trained[k], start[k]) for k in trained if k.endswith("W_k.bias"))
    assert not torch.equal(trained["blocks.0.W_q.bias"], start["blocks.0.W_q.bias"])  # others learn
    model = training.Toy(run.spec)
    model.load_state_dict(trained)
    ids = training.probe_batch(run.spec)
    _, _, before = model(ids)
    with torch.no_grad():
        for block in model.blocks:
            block.W_k.bias.add_(torch.randn_like(block.W_k.bias))  # the softmax is blind to it
    _, _, after = model(ids)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(before, after))


def test_resumed_training_equals_uninterrupted(tmp_path):
    spec = Spec.of("previous-token", steps=40, snapshots=5)
    whole = run_training(spec)
    half = run_training(Spec.of("previous-token", steps=20, snapshots=5))
    path = tmp_path / "half.pt"
    checkpoints.save(half, str(path))
    resumed = run_training(spec, resume=checkpoints.read_checkpoint(str(path)))
    assert resumed.losses == whole.losses
    for name, value in whole.state["model"].items():
        assert torch.equal(value, resumed.state["model"][name]), name


def test_the_command_saves_a_run_every_view_reads(cli, tmp_path):
    from PIL import Image

    run, png = tmp_path / "run.pt", tmp_path / "train.png"
    result = cli("train", "--task", "previous-token", "--steps", "120", "--save", str(run),
                 "--format", "json", "--png", str(png))
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["command"] == "train" and data["spec"]["task"] == "previous-token"
    assert len(data["losses"]) == 120 and data["snapshots"][-1]["step"] == 120
    assert set(data["snapshots"][0]) == {"step", "loss", "previous_token", "two_back", "induction"}
    assert data["formed"]["previous_token"] and Image.open(png).size == (1920, 1080)
    again = cli("train", "--task", "previous-token", "--steps", "120", "--format", "json")
    assert again.stdout == result.stdout  # the same seed, the same bytes
    loaded = checkpoints.read_checkpoint(str(run))
    step = data["formed"]["previous_token"][0]["step"]
    heads = json.loads(cli("heads", "--checkpoint", str(run), "--at-step", "120", "--layer", "1",
                           "--format", "json").stdout)
    assert [t.split("·")[0] for t in heads["tokens"]] == [str(i) for i in loaded.probe]
    l, h = data["formed"]["previous_token"][0]["layer"], data["formed"]["previous_token"][0]["head"]
    w = np.array(next(x for x in heads["heads"] if x["head"] == h)["weights"])
    assert np.mean([w[q, q - 1] for q in range(1, len(w))]) > 0.5  # what train reported
    assert step <= 120 and l == 1
    explained = cli("explain", "--checkpoint", str(run), "--sentence", "3 1 4 1 5", "--token", "4")
    assert explained.exit_code == 0 and "'4'" in explained.stdout


@pytest.mark.parametrize("args, message", [
    (("heads", "--checkpoint", "{run}", "--at-step", "7"), "has no snapshot at step 7 (saved: "),
    (("heads", "--checkpoint", "{junk}"), "is not a checkpoint from mha-trace train"),
    (("heads", "--checkpoint", "{run}", "--sentence", "the cat"), "this run's text is token ids 0 to 15"),
    (("heads", "--at-step", "3"), "--at-step picks a saved step of --checkpoint run.pt"),
    (("train", "--task", "sorting"), "task 'sorting' is not one of induction, previous-token"),
    (("train", "--heads", "3"), "3 heads do not divide d_model 64"),
    (("ablate", "--checkpoint", "{run}", "--prune"), "was trained to predict its task's targets, "
     "not the next token"),
])
def test_bad_runs_get_one_line(cli, tmp_path, args, message):
    run, junk = tmp_path / "run.pt", tmp_path / "junk.pt"
    checkpoints.save(run_training(Spec.of("previous-token", steps=4, snapshots=2)), str(run))
    torch.save({"something": "else"}, junk)
    result = cli(*(a.format(run=run, junk=junk) for a in args))
    assert result.exit_code == 2 and result.stderr.startswith("Error: ")
    assert message in result.stderr and len(result.stderr.splitlines()) == 1


def test_the_api_trains_saves_and_reads_a_run_as_a_model(tmp_path):
    import mha_trace

    path = tmp_path / "api.pt"
    r = mha_trace.train("previous-token", steps=30, snapshots=3, save=path)
    assert isinstance(r, training.Training) and [s.step for s in r.snapshots][-1] == 30
    m = mha_trace.model(f"{path}@30")
    assert repr(m).endswith("api.pt at step 30, 1 layer × 4 heads>")
    view = m.heads(layer=1)
    np.testing.assert_allclose(view.layers[0], r.snapshots[-1].weights[0], atol=1e-6)
    with pytest.raises(mha_trace.MhaError, match="train has no option 'layer'"):
        mha_trace.train(layer=2)


def test_a_run_is_read_once_until_its_file_is_written_again(tmp_path, monkeypatch):
    """A notebook's or the explorer's calls on one run read the file once; a run saved over it
    (another run, the same path) is what the next call reads."""
    import mha_trace
    from mha_trace.models import checkpoints

    path, reads = tmp_path / "again.pt", []
    real = checkpoints.read_checkpoint
    monkeypatch.setattr(checkpoints, "read_checkpoint", lambda *a, **k: reads.append(a) or real(*a, **k))
    mha_trace.train("previous-token", steps=6, snapshots=2, save=path)
    first = [mha_trace.model(str(path)).heads(layer=1).layers[0] for _ in range(3)]
    assert len(reads) == 1 and all(np.array_equal(first[0], f) for f in first)
    r = mha_trace.train("previous-token", steps=8, snapshots=2, save=path)
    assert "at step 8" in repr(mha_trace.model(str(path))) and len(reads) == 2
    np.testing.assert_allclose(mha_trace.model(str(path)).heads(layer=1).layers[0],
                               r.snapshots[-1].weights[0], atol=1e-6)
    assert len(reads) == 2


def test_a_checkpoint_path_may_hold_an_at_sign_of_its_own(cli, tmp_path, default_run):
    """runs/run@best.pt is a path, not run@ step "best.pt"; a step still follows the last @."""
    import shutil

    import mha_trace

    path = tmp_path / "run@best.pt"
    shutil.copy(default_run, path)
    shown = cli("heads", "--checkpoint", str(path), "--layer", "1")
    assert shown.exit_code == 0 and shown.stdout.startswith("run@best.pt at step 600, layer 1")
    assert "at step 428" in repr(mha_trace.model(f"{path}@428"))


def test_the_default_runs_slide_is_laid_out(induction_run):
    """The default run's slide (loss over 600 steps, each head's scores under it): every text on
    the slide, none over another text or another panel."""
    from slides import laid_out

    from mha_trace.render.training_slide import training_figure

    plt, fig = training_figure(induction_run)
    try:
        boxes = laid_out(fig)
    finally:
        plt.close(fig)
    assert len(boxes) > 10
