"""The KV-cache lab: full equals transformers over the lab's default text; the masked pass and the
replayed pass equal real decoding; an evicting cache keeps what its policy says; bytes are cost's."""

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import mha_trace
from mha_trace.analyses import kvcache
from mha_trace.analyses.evictions import PolicyCache, Setting
from mha_trace.models.smollm2 import load_smollm2

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

REFERENCE = np.load(Path(__file__).parent / "fixtures" / "cache_reference.npz")
TEXT = "The cat sat on the mat. The dog sat on the log. The cat and the dog were friends."


@pytest.fixture(scope="module")
def model():
    """Dequantised once for the module: each decode would otherwise dequantise every layer."""
    m = load_smollm2()
    with m.resident():
        yield m


@pytest.fixture(scope="module")
def ids(model):
    return kvcache.text_ids(model, TEXT, 64)  # 24 tokens, BOS first


@pytest.fixture(scope="module")
def short(ids):
    return ids[:10]  # for decoding token by token (30 layers a token)


def test_full_equals_transformers_over_the_default_text(model):
    """The lab's text (the bundled corpus in file order, BOS first, 512 tokens) tokenized as
    transformers does, and its loss equal to LlamaForCausalLM's from the same GGUF."""
    ids = kvcache.text_ids(model, kvcache.bundled_text()[1], 512)
    assert ids == REFERENCE["ids"].tolist()
    full = kvcache.masked_pass(model, ids, Setting("full", None, 4))
    assert full.nll == pytest.approx(float(REFERENCE["nll"].astype(np.float64).mean()), abs=1e-4)
    assert torch.equal(kvcache.position_mask(Setting("full", None, 4), 9),
                       torch.ones(9, 9, dtype=torch.bool).tril())  # one ordinary causal pass


def test_the_masked_pass_equals_decoding_token_by_token(model, short):
    """window and sinks decoded for real (together, a batch row each) equal their masked pass."""
    ids, todo = short, [Setting("window", 8, 2), Setting("sinks", 8, 2)]
    for s, real in zip(todo, kvcache.decode(model, ids, todo)):
        fast = kvcache.masked_pass(model, ids, s)
        assert real.decoded and not fast.decoded
        assert fast.nll == pytest.approx(real.nll, abs=1e-5)
        assert np.allclose(fast.held, real.held)
        expected = set(range(2)) | set(range(len(ids) - 6, len(ids))) if s.policy == "sinks" \
            else set(range(len(ids) - 8, len(ids)))
        assert set(np.flatnonzero(fast.held)) == expected


def test_the_replayed_pass_equals_decoding_token_by_token(model):
    """h2o a layer at a time, its evictions replayed over each layer's weights, equals h2o decoded
    for real through the lecture's module and its cache: the same keys held at the end in every
    layer and K/V head, the same losses. 20 tokens, budgets from 6 (evicting from the 7th token
    on) to the whole text, two sinks, together as the lab runs them."""
    ids = kvcache.text_ids(model, kvcache.bundled_text()[1], 20)
    todo = [Setting("h2o", b, 2) for b in (6, 10, 20)]
    replayed, decoded = kvcache.replayed_pass(model, ids, todo), kvcache.decode(model, ids, todo)
    for s, fast, real in zip(todo, replayed, decoded):
        assert fast.how == "replayed" and real.how == "decoded"
        assert fast.nll == pytest.approx(real.nll, abs=1e-5), s
        assert np.array_equal(fast.held, real.held), s
    assert len({round(r.nll, 4) for r in replayed}) == len(todo)  # each budget keeps other keys
    assert replayed[-1].nll == pytest.approx(kvcache.masked_pass(model, ids, Setting("full", None, 2)).nll,
                                             abs=1e-5)


def test_a_budget_as_long_as_the_text_is_full_for_every_policy(model, short):
    ids = short
    full = kvcache.masked_pass(model, ids, Setting("full", None, 2)).nll
    todo = [Setting("window", len(ids), 2), Setting("sinks", 32, 2), Setting("h2o", 32, 2),
            Setting("sinks", 32, 2, renumber=True), Setting("h2o", len(ids), 2, renumber=True)]
    real = [s for s in todo if kvcache.decoded(s)]
    found = dict(zip(real, kvcache.decode(model, ids, real)))
    found |= dict(zip(todo[2:3], kvcache.replayed_pass(model, ids, todo[2:3])))
    for s in todo:
        r = found[s] if s in found else kvcache.masked_pass(model, ids, s)
        assert r.nll == pytest.approx(full, abs=1e-5), s


def test_renumbering_a_window_changes_nothing_but_renumbering_sinks_does(model, short):
    """RoPE depends on relative positions, and a window's are the same renumbered; the sinks'
    are not (they move next to the recent tokens)."""
    todo = [Setting("window", 6, 2, renumber=True), Setting("sinks", 6, 2, renumber=True)]
    for s, again, same in zip(todo, kvcache.decode(model, short, todo), (True, False)):
        plain = kvcache.masked_pass(model, short, Setting(s.policy, 6, 2)).nll
        assert (abs(plain - again.nll) < 1e-4) == same, (s, plain, again.nll)


def _fed(cache: PolicyCache, weight) -> PolicyCache:
    """Feed a cache 12 tokens one at a time: key = value = the position; each held key at
    position p gets weight(t, p) from query t (the same for each of the group's query heads)."""
    for t in range(12):
        k = torch.full((1, 2, 1, 4), float(t))
        keys, _ = cache.append(k, k)
        held = cache.positions[0, 0].tolist()  # each slot's position, -1 where empty
        w = torch.tensor([weight(t, p) if p >= 0 else 0.0 for p in held]).view(1, 1, 1, -1)
        cache.observe(w.expand(1, 4, 1, -1))
        cache.position += 1  # as decode moves its layers' shared clock on
    return cache


def test_h2o_keeps_the_sinks_the_recent_half_and_the_heaviest_keys():
    """Budget 8, 2 sinks: after 12 tokens the cache holds 0, 1, the last 4 (B/2), and the two
    middle keys that received the most attention (here 3 and 5), for both K/V heads."""
    rng = np.random.default_rng(0)
    noise = rng.random((12, 12)) * 0.01
    heavy = {3: 0.9, 4: 0.01, 5: 0.5}  # keys 3 and 5 get heavy weight while they are held
    weight = lambda t, p: heavy.get(p, noise[t, p])
    kept = lambda c: c.positions[0].sort(-1).values.tolist()
    cache = _fed(PolicyCache([Setting("h2o", 8, 2)], group=2, rope_base=10000.0, tokens=12, position=torch.tensor(0)), weight)
    assert kept(cache) == [[0, 1, 3, 5, 8, 9, 10, 11]] * 2
    assert torch.equal(cache.k[0, :, :, 0], cache.positions[0].float())  # keys moved with them
    sinks = _fed(PolicyCache([Setting("sinks", 8, 2)], group=2, rope_base=10000.0, tokens=12, position=torch.tensor(0)), weight)
    assert kept(sinks) == [[0, 1, 6, 7, 8, 9, 10, 11]] * 2


def test_caches_in_one_batch_keep_what_each_keeps_alone():
    """Three settings in one PolicyCache (a row each, budgets 6 and 8 in buffers 8 wide) keep,
    row by row, what each keeps alone; a row sees only its own slots."""
    rng = np.random.default_rng(1)
    noise = rng.random((12, 12))
    weight = lambda t, p: noise[t, p]
    todo = [Setting("h2o", 8, 2), Setting("window", 6, 2), Setting("h2o", 6, 1)]
    kept = lambda c, row: [sorted(p for p in head if p >= 0) for head in c.positions[row].tolist()]
    together = _fed_rows(PolicyCache(todo, group=2, rope_base=10000.0, tokens=12, position=torch.tensor(0)), weight)
    for r, s in enumerate(todo):
        alone = _fed(PolicyCache([s], group=2, rope_base=10000.0, tokens=12, position=torch.tensor(0)), weight)
        assert kept(together, r) == kept(alone, 0) and len(kept(alone, 0)[0]) == s.budget, s
    assert together.visible()[:, 0, 0].tolist() == [[True] * 8, [True] * 6 + [False] * 2,
                                                     [True] * 6 + [False] * 2]


def _fed_rows(cache: PolicyCache, weight) -> PolicyCache:
    """`_fed` for a cache of several rows: each row's keys get the weight of their position."""
    for t in range(12):
        k = torch.full((len(cache.budgets), 2, 1, 4), float(t))
        cache.append(k, k)
        held = cache.positions[:, 0].tolist()
        w = torch.tensor([[weight(t, p) if p >= 0 else 0.0 for p in row] for row in held])
        cache.observe(w[:, None, None, :].expand(-1, 4, 1, -1))
        cache.position += 1
    return cache


def test_cache_bytes_are_costs_figure(cli):
    """The guide's lab (its masked passes are the guide's: run once), two of its budgets."""
    data = json.loads(cli("cache", "--tokens", "128", "--budget", "16,32", "--policy", "window",
                          "--format", "json").stdout)
    assert [r["budget"] for r in data["results"]] == [None, 16, 32]
    for r in data["results"]:
        kept = r["budget"] or data["tokens"]
        for dtype in ("float32", "float16"):
            cost = json.loads(cli("cost", "--preset", "smollm2-135m", "--seq", str(kept), "--dtype",
                                  dtype, "--format", "json").stdout)
            row = next(x for x in cost["rows"] if x["item"] == "KV cache, batch × seq × layers")
            assert r["cache_bytes"][dtype] == row["total"]


def test_the_command_table_strips_and_slide(cli, tmp_path):
    from PIL import Image

    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    png = tmp_path / "cache.png"
    result = cli("cache", "--text", str(text), "--budget", "8,16", "--sinks", "2", "--policy",
                 "window,sinks", "--png", str(png), "--width", "100")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert max(map(len, lines)) <= 100
    assert [line.split()[:2] for line in lines if line.split()[:1] in (["window"], ["sinks"])
            and line.split()[1].isdigit() and "." in line][:4] == [
        ["window", "8"], ["sinks", "8"], ["window", "16"], ["sinks", "16"]]
    strip = next(line for line in lines if line.startswith("sinks 8"))
    assert strip.split()[-1].startswith("█")  # the sinks held at the left
    assert "Budget 8:" in result.stdout and "The formula is cost's" in result.stdout
    assert result.stderr.startswith("Wrote ") and Image.open(png).size == (1920, 1080)


@pytest.mark.parametrize("args,message", [
    (("--policy", "full,nope"), "--policy 'nope' is not one of full, window, sinks, h2o"),
    (("--budget", "8,x"), "--budget: takes a comma-separated list, e.g. --budget 64,128,256"),
    (("--budget", "8"), "--budget 8 leaves no room beside 4 sinks"),
    (("--model", "minilm"), "the KV-cache lab needs a model that decodes with a KV cache"),
    (("--text", "no-such-file.txt"), "--text: no-such-file.txt: not found"),
    (("--text", "README.md", "--tokens", "4000", "--renumber"), "the guard stops at 10 min"),
])
def test_bad_settings_are_one_line(cli, args, message):
    result = cli("cache", *args)
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr, result.stderr


def test_the_api_returns_the_same_record(ids):
    import mha_trace

    r = mha_trace.model("smollm2").cache(TEXT, policies="window", budgets=[8], sinks=2, tokens=64)
    assert [x.setting.policy for x in r.results] == ["full", "window"]
    assert r.data()["tokens"] == len(ids) and "Memory: budget 8" in str(r)
    from mha_trace.render.kvcache import timing

    assert re.fullmatch(r"Took [0-9.]+ s: 2 masked passes [0-9.]+ s\.", timing(r))  # at a terminal
    both = mha_trace.model("smollm2").cache(TEXT, policies="window,h2o", budgets=[8, 10], sinks=2,
                                            tokens=12)
    assert re.fullmatch(r"Took [0-9.]+ s: 3 masked passes [0-9.]+ s, 2 h2o settings a layer at a "
                        r"time, evictions replayed, together [0-9.]+ s\.", timing(both))
    renumbered = mha_trace.model("smollm2").cache(TEXT, policies="sinks", budgets=[10], sinks=2,
                                                  tokens=12, renumber=True)
    assert re.fullmatch(r"Took [0-9.]+ s: 2 masked passes [0-9.]+ s, 1 setting decoded token by "
                        r"token [0-9.]+ s \([0-9]+ ms a token\)\.", timing(renumbered))


def test_what_a_long_text_would_hold_is_refused_before_it_runs(cli, monkeypatch):
    from mha_trace.core import runtime

    monkeypatch.setattr(runtime, "available_bytes", lambda device: 10_000_000)
    result = cli("cache", "--text", "README.md", "--tokens", "200", "--policy", "window",
                 "--budget", "64")
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: --tokens: 200 tokens through SmolLM2-135M-Instruct "
                                    "would hold about") and result.stderr.endswith("fewer --tokens\n")


def test_a_trained_run_reads_its_probe_and_decodes_like_its_masked_pass(cli, tmp_path):
    """A run saved by train (learned positions, no RoPE): its probe sequence by default; the
    masked pass equals decoding (positions go on from the cache), full equals its own forward."""
    import mha_trace
    from mha_trace.models import load_model

    path = tmp_path / "run.pt"
    mha_trace.train("induction", steps=20, snapshots=2, save=str(path))
    m = load_model(str(path))
    name, text = kvcache.bundled_text(m)
    ids = kvcache.text_ids(m, text, 512)
    assert name == "the run's probe sequence" and len(ids) == m.spec.seq
    with torch.no_grad():
        logits = m.toy(torch.tensor([ids]))[0][0, :-1].double()
    reference = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:])).item()
    assert kvcache.masked_pass(m, ids, Setting("full", None, 2)).nll == pytest.approx(reference, abs=1e-6)
    todo = [Setting("window", 8, 2), Setting("sinks", 8, 2), Setting("h2o", len(ids), 2),
            Setting("h2o", 8, 2)]
    together = kvcache.decode(m, ids, todo)  # a batch row each
    for s, r in zip(todo[:2], together):
        assert r.nll == pytest.approx(kvcache.masked_pass(m, ids, s).nll, abs=1e-5)
    assert together[2].nll == pytest.approx(reference, abs=1e-5)
    for s, r in zip(todo, together):  # as each decodes alone
        alone = kvcache.decode(m, ids, [s])[0]
        assert r.nll == pytest.approx(alone.nll, abs=1e-6) and np.array_equal(r.held, alone.held), s
    for s, fast, r in zip(todo[2:], kvcache.replayed_pass(m, ids, todo[2:]), together[2:]):
        assert fast.nll == pytest.approx(r.nll, abs=1e-5) and np.array_equal(fast.held, r.held), s
    result = cli("cache", "--checkpoint", str(path), "--budget", "8", "--sinks", "2", "--format", "json")
    assert json.loads(result.stdout)["text"] == "the run's probe sequence"
    refused = cli("cache", "--checkpoint", str(path), "--renumber")
    assert refused.exit_code == 2 and "adds learned positions at its input" in refused.stderr


def test_a_budget_that_holds_the_whole_text_says_why_its_rows_equal_full(cli, default_run):
    shown = cli("cache", "--checkpoint", str(default_run), "--budget", "12,64").stdout
    flat = " ".join(shown.split())
    assert ("Budget 64 holds the whole text of 32 tokens: every policy keeps every token, so its rows "
            "equal full and save nothing") in flat
    assert "-0.000" not in shown


def test_the_progress_bar_counts_work_so_its_estimate_holds_steady(default_run, model):
    """Each masked pass, each layer of the replayed pass and each decoded token advances the bar
    by the tenths of a second of its estimate, and the bar ends exactly full (its estimate once
    jumped from 0:00:01 to 0:15:21 as the passes gave way to the decodes). A trained run's probe;
    SmolLM2 renumbering (a run with learned positions cannot)."""
    import contextlib

    from mha_trace.models.guards import seconds

    trained = mha_trace.model(str(default_run)).model
    for m, text, renumber in ((trained, trained.default_text, False), (model, TEXT, True)):
        seen = {}

        @contextlib.contextmanager
        def progress(total):
            seen["total"], seen["done"] = total, 0
            yield lambda *_: seen.__setitem__("done", seen["done"] + 1)

        lab = kvcache.cache_lab(m, "a text", text, 12, ["full", "window", "h2o"], [10], 4, renumber,
                                progress)
        todo, T = [r.setting for r in lab.results], len(lab.ids)
        assert seen["done"] == seen["total"] == kvcache.lab_work(m, T, todo)
        kinds = {"masked": 2, "replayed": 1, "decoded": 2 if renumber else 0}
        assert {how: sum(r.how == how for r in lab.results) for how in kinds} == kinds
        each, layer, token = kvcache.lab_ticks(m, T, todo)
        assert seen["total"] == 2 * each + m.layers * layer + T * token * renumber
        assert each == max(1, round(seconds(m, T) / kvcache.TICK))
        replaying = seconds(m, T, 2) + T * m.layers * kvcache.REPLAY_SECONDS  # a row, and attention
        assert layer == max(1, round(replaying / m.layers / kvcache.TICK))
        decoding = T * kvcache.step_seconds(m, 2)  # window and h2o renumbered, together
        assert token == (max(1, round(decoding / T / kvcache.TICK)) if renumber else 1)


@contextlib.contextmanager
def nothing_read_back():
    """Every way a tensor's value reaches Python (a read back from the GPU, which waits for it),
    made an error while it lasts."""
    import unittest.mock

    def refused(name):
        def read_back(*_, **__):
            raise AssertionError(f"Tensor.{name} read a value back to the host inside a step")
        return read_back

    names = ("item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__")
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(unittest.mock.patch.object(torch.Tensor, name, refused(name)))
        yield


def test_the_token_loops_read_nothing_back_to_the_host(model, monkeypatch):
    """On CUDA each step of the replayed pass and of decoding is captured as a graph and replayed
    (`runtime.replayed`), and a value read back inside one would wait for the GPU at every token
    and break the capture. Here, on the CPU, every step runs with each such read made an error:
    h2o replayed, and every kind decoded (renumbered too) on SmolLM2's first 12 tokens."""
    from mha_trace.core import runtime

    real, steps = runtime.replayed, []

    def strict(step, device):
        def guarded():
            steps.append(1)
            with nothing_read_back():
                return step()
        return real(guarded, device)

    monkeypatch.setattr(runtime, "replayed", strict)
    ids = kvcache.text_ids(model, TEXT, 12)
    todo = [Setting("window", 6, 2), Setting("sinks", 6, 2, renumber=True), Setting("h2o", 6, 2)]
    kvcache.replayed_pass(model, ids, todo[2:])
    kvcache.decode(model, ids, todo)
    assert len(steps) == model.layers * len(ids) + len(ids)  # every step ran under the guard


def test_the_slide_writes_two_close_perplexities_on_either_side_of_their_points(kept_slides):
    """The default lab's sinks and h2o run together: at each budget the lower of two close points
    has its value written under it, the other over it, and no text lies over another."""
    from types import SimpleNamespace as Fake

    from slides import laid_out

    from mha_trace.render import cache_slide

    made = kept_slides(cache_slide)
    row = lambda policy, budget, ppl: Fake(setting=Setting(policy, budget, 4), perplexity=ppl)
    results = [row("window", 64, 60.9), row("sinks", 64, 27.2), row("h2o", 64, 27.5),
               row("window", 128, 52.7), row("sinks", 128, 25.6), row("h2o", 128, 25.3)]
    lab = Fake(full=Fake(perplexity=24.9), results=results, ids=[0] * 512,
               model=Fake(name="SmolLM2-135M-Instruct"), text_name="the bundled corpus")
    cache_slide.cache_slide(lab, "c.png")
    (fig,) = made
    laid_out(fig)
    under = {t.get_text() for t in fig.axes[0].texts if t.xyann[1] < 0}
    assert under == {"27.2", "25.3", "24.9"}  # the lower of each pair, and the full cache's line
