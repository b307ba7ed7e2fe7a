"""explain --why: every score split by source, on a config, MiniLM, SmolLM2 and a trained run.

The parts must add up to the score the walk computed (to 1e-4 in float32 models); "without it"
must equal the scores recomputed by the attention's own projections on the input with that
source's part taken out of it (an independent route: the module, not the pairs); and the split
stream must equal transformers' hidden states (tests/fixtures/minilm_reference.npz).
"""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import mha_trace
from mha_trace.models.stream import stream_parts

pytestmark = pytest.mark.slow  # loads a real model, trains, or starts processes and browsers

SENTENCE = "The animal didn't cross the street because it was too tired."


def softmax(score, allowed):
    out = np.zeros_like(score)
    e = np.exp(score[allowed] - score[allowed].max())
    out[allowed] = e / e.sum()
    return out


def test_a_configs_parts_are_the_chapters_products():
    w = mha_trace.explain("chicken-road", token="it", why=True)
    for hw, why in zip(w.heads, w.why):
        products = np.array([[q * k for q, k in t.products] for t in hw.terms]).T / w.sqrt_dk
        np.testing.assert_allclose(why.parts, products, atol=1e-12)
        np.testing.assert_allclose(why.parts.sum(0), [t.scaled for t in hw.terms], atol=1e-12)
        d = 3  # without dim d: the softmax of the scores less that product, by hand
        np.testing.assert_allclose(why.without(d), softmax(why.score - products[d], why.allowed))


def test_the_chapters_head_1_without_its_second_dim_spreads_evenly():
    """'cat''s query is [0, 2] in head 1: every score comes from dim 1, and without it the five
    keys get 0.2 each; without dim 0 nothing moves."""
    w = mha_trace.explain("cat-sat-on-mat", token="cat", head=1, why=True)
    why = w.why[0]
    assert why.sources == ["dim 0", "dim 1"]
    np.testing.assert_allclose(why.without(1), 0.2)
    np.testing.assert_allclose(why.without(0), why.weights())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    path = tmp_path_factory.mktemp("why") / "run.pt"
    mha_trace.train("induction", steps=20, snapshots=2, save=str(path))
    return mha_trace.model(str(path))


def _independent_without(run, why, position: int, parts: dict, name: str) -> np.ndarray:
    """The head's weights recomputed by the module's own W_q, W_k (and RoPE) on the attention
    input less one source's part."""
    from mha_trace.core.attention import rope

    a, h = run.module, why.head - 1
    d = a.d_k
    g = h // (a.heads // a.kv_heads)
    x = sum(parts.values()) - parts[name]
    with torch.no_grad():
        q = torch.nn.functional.linear(x, a.W_q.weight.double(), None if a.W_q.bias is None else a.W_q.bias.double())
        k = torch.nn.functional.linear(x, a.W_k.weight.double(), None if a.W_k.bias is None else a.W_k.bias.double())
        q = q.view(len(x), a.heads, d).transpose(0, 1)[None]
        k = k.view(len(x), a.kv_heads, d).transpose(0, 1)[None]
        if a.rope:
            q, k = rope(q, 0, a.rope_base), rope(k, 0, a.rope_base)
        score = (k[0, g] @ q[0, h, position]) / math.sqrt(d)
    return softmax(score.numpy(), why.allowed)


@pytest.mark.parametrize("name,layer,by_head", [
    ("minilm", 1, False), ("minilm", 4, True), ("minilm", 6, False),
    ("smollm2", 1, False), ("smollm2", 3, True), ("smollm2", 30, False),
    ("trained", 2, True)])
def test_parts_add_up_and_without_equals_the_module_on_the_input_less_that_part(
        name, layer, by_head, request, trained):
    m = trained if name == "trained" else mha_trace.model(name)
    text = None if name == "trained" else SENTENCE
    run = m.run(text, layer)
    position = 8 if name != "trained" else 12
    w = m.explain(text, position=position, layer=layer, why=True, by_head=by_head)
    parts = stream_parts(run.sentence.model, run.sentence.ids, layer, by_head)
    real = run.sentence.model.attention_input(run.sentence.inputs, layer)[0].double()
    assert float((sum(parts.values()) - real).abs().max()) < 1e-4
    assert len(w.why) == run.module.heads
    for why, hw in zip(w.why, w.heads):
        scaled = np.array([t.scaled for t in hw.terms])
        np.testing.assert_allclose(why.pairs.sum((0, 1)), scaled, atol=1e-4)
        np.testing.assert_allclose(why.parts.sum(0), scaled, atol=1e-4)
        for source in [s for s in why.sources if s != "biases"][:4]:
            np.testing.assert_allclose(why.without(why.sources.index(source)),
                                       _independent_without(run, why, position, parts, source),
                                       atol=2e-4)
    expected = {"minilm": {"token", "position", "biases"}, "smollm2": {"token"},
                "trained": {"token", "position", "biases"}}[name]
    assert expected <= set(w.why[0].sources)
    assert any(s.startswith(f"L{layer - 1}.H") for s in w.why[0].sources) == (by_head and layer > 1)


def test_minilms_split_stream_sums_to_transformers_hidden_states():
    ref = np.load(Path(__file__).parent / "fixtures" / "minilm_reference.npz")
    meta = json.loads(str(ref["meta"]))
    model = mha_trace.model("minilm").model
    s = model.encode(meta["sentences"][0])
    for k, layer in enumerate(meta["hidden_layers"]):
        if layer < model.layers:  # hidden_states[layer] is what layer + 1 reads
            parts = stream_parts(model, s.ids, layer + 1)
            np.testing.assert_allclose(sum(parts.values()).numpy(), ref["s0_hidden"][k], atol=2e-5)


def test_json_page_and_errors(cli):
    data = json.loads(cli("explain", "--token", "it", "--config", "chicken-road", "--why",
                          "--head", "2", "--format", "json").stdout)
    assert [y["head"] for y in data["why"]] == [2]
    for key, walked in zip(data["why"][0]["keys"], data["heads"][0]["keys"]):  # head 2 alone
        assert sum(key["parts"].values()) == pytest.approx(walked["scaled"], abs=1e-12)
    assert set(data["why"][0]["without"]) == set(data["why"][0]["sources"])
    for args, message in [
        (("explain", "--by-head"), "Error: --by-head splits the sources --why finds: add --why"),
        (("explain", "--why", "--by-head"), "Error: --by-head splits a model's earlier"),
    ]:
        result = cli(*args)
        assert result.exit_code == 2 and result.stderr.startswith(message), result.stderr


def test_the_terminal_names_the_largest_parts_and_the_sources(cli):
    out = cli("explain", "--model", "minilm", "--token", "it", "--head", "3.1", "--why",
              "--width", "100").stdout
    assert "Sources: the token embedding, the position embedding" in out
    assert "Head 3.1 without each source" in out and "without position" in out
    smollm2 = cli("explain", "--model", "smollm2", "--token", "it", "--head", "2.3", "--why").stdout
    assert "no position embedding (RoPE turns q and k" in smollm2


def test_the_slide_colours_each_source_once(cli, kept_slides):
    from mha_trace.render import why_slide

    made = kept_slides(why_slide)
    assert cli("explain", "--token", "cat", "--why", "--png", "x.png").exit_code == 0
    labels = [t.get_text() for t in made[-1].legends[0].get_texts()]
    assert sorted(labels) == ["dim 1", "dim 3", "score"]  # dims 0 and 2 are all zero: no colour


def test_a_users_module_is_split_from_its_own_product_as_it_runs(cli):
    """The chapter's PyTorch code, fed the chapter's Q, K, V: its caught q·k splits as the
    config's does; a module whose weights are not softmax(q·k/√d_k) of that product is refused."""
    data = json.loads(cli("explain", "--module", "example:chapter_torch", "--token", "cat",
                          "--why", "--format", "json").stdout)
    config = mha_trace.explain("cat-sat-on-mat", token="cat", why=True)
    for got, why in zip(data["why"], config.why):
        for key, j in zip(got["keys"], range(5)):
            assert list(key["parts"].values()) == pytest.approx(list(why.parts[:, j]), abs=1e-6)
    for module, message in [("tests/student/student_bugs.py:NotScaled", "is where its weights come from (the closest"),
                            ("example:chapter_numpy", "which a NumPy module does not show")]:
        result = cli("explain", "--module", module, "--why")
        assert result.exit_code == 2 and message in result.stderr, result.stderr


LOOPS = '''
import math
import torch
import torch.nn as nn


class Base(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)


class LoopHeads(Base):
    def forward(self, x):
        q, k, v = self.W_q(x), self.W_k(x), self.W_v(x)
        outs, ws = [], []
        for i in range(self.h):
            c = slice(i * self.d_k, (i + 1) * self.d_k)
            w = torch.softmax(q[..., c] @ k[..., c].transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
            outs.append(w @ v[..., c])
            ws.append(w)
        return self.W_o(torch.cat(outs, -1)), torch.stack(ws, 1)


class BatchLoop(Base):
    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (W(x).view(B, T, self.h, self.d_k).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))
        ws, outs = [], []
        for b in range(B):
            w = (torch.stack([q[b, h] @ k[b, h].T for h in range(self.h)]) / math.sqrt(self.d_k)).softmax(-1)
            ws.append(w)
            outs.append(torch.stack([w[h] @ v[b, h] for h in range(self.h)]))
        return self.W_o(torch.stack(outs).transpose(1, 2).reshape(B, T, D)), torch.stack(ws)


class HelperFirst(Base):
    def forward(self, x):
        B, T, D = x.shape
        near = torch.eye(T) @ torch.ones(T, T)  # a T x T product that is not q.k, before it
        q, k, v = (W(x).view(B, T, self.h, self.d_k).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))
        w = (q @ k.transpose(-2, -1) / math.sqrt(self.d_k) + 0 * near).softmax(-1)
        return self.W_o((w @ v).transpose(1, 2).reshape(B, T, D)), w
'''


@pytest.mark.parametrize("cls", ["LoopHeads", "BatchLoop", "HelperFirst"])
def test_why_follows_a_loop_over_heads_or_over_the_batch(cli, tmp_path, cls):
    """The scores of a module that loops over its heads (or its batch, then its heads) are found
    head by head, and split: once "unexpected IndexError"; a T×T product of a helper before q·k
    is passed over for the one whose softmax gives the weights (once "unexpected RuntimeError")."""
    path = tmp_path / "loops.py"
    path.write_text(LOOPS)
    looped = cli("explain", "--module", f"{path}:{cls}", "--heads", "2", "--d-model", "8", "--why")
    assert looped.exit_code == 0, looped.stderr
    assert "Head 2, query" in looped.stdout
