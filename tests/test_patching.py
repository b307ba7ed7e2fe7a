"""`mha-trace patch`: activation patching, checked against a forward pass of the trained run written
out here by hand (no hooks, no resume), against identities from first principles, and on SmolLM2's
indirect-object sentence."""

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from slides import laid_out
import torch

from mha_trace.analyses.patch_inputs import default_pair, parse_metric
from mha_trace.analyses.patching import patch
from mha_trace.core.attention import rope
from mha_trace.models.trained import Trained

pytestmark = pytest.mark.slow  # trains (the shared default run) or loads SmolLM2


def by_hand(toy, ids, patched_layer=None, head=None, source_context=None, rows=slice(None)):
    """The trained model's forward, written out: embeddings, each layer's heads (causal), W_o and
    the residual, then the unembedding; optionally one head's context taken from another run.
    Returns (final hidden (T, D), each layer's context (T, H·d_k))."""
    x = toy.embed(ids) + toy.position.weight[:len(ids)]
    T, contexts = len(ids), []
    for layer, block in enumerate(toy.blocks, 1):
        H, d = block.heads, block.d_k
        q = block.W_q(x).view(T, H, d).transpose(0, 1)
        k = block.W_k(x).view(T, H, d).transpose(0, 1)
        v = block.W_v(x).view(T, H, d).transpose(0, 1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(d)
        scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        context = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, H * d)
        if layer == patched_layer:
            context = context.clone()
            context[rows, head * d:(head + 1) * d] = source_context[rows, head * d:(head + 1) * d]
        contexts.append(context)
        x = x + block.W_o(context)
    return x, contexts


def loss_on_shared(toy, hidden, clean, corrupt) -> float:
    at = [t for t in range(len(clean) - 1) if clean[t + 1] == corrupt[t + 1]]
    logits = toy.unembed(hidden[at])
    return torch.nn.functional.cross_entropy(logits, torch.tensor([clean[t + 1] for t in at])).item()


@pytest.fixture(scope="module")
def trained(default_run):
    model = Trained(str(default_run), None)
    clean, corrupt, metric = default_pair(model)
    return model, clean, corrupt, patch(model, clean, corrupt, parse_metric(model, metric))


def test_each_heads_patch_is_the_forward_pass_written_out(trained):
    model, clean, corrupt, p = trained
    a, b = ([int(t) for t in text.split()] for text in (clean, corrupt))
    with torch.no_grad():
        _, clean_contexts = by_hand(model.toy, torch.tensor(a))
        hidden, _ = by_hand(model.toy, torch.tensor(b))
        assert p.corrupt_value == pytest.approx(loss_on_shared(model.toy, hidden, a, b), abs=1e-5)
        for layer in range(1, model.layers + 1):
            for head in range(model.heads):
                hidden, _ = by_hand(model.toy, torch.tensor(b), layer, head, clean_contexts[layer - 1])
                assert p.heads[layer - 1, head] == pytest.approx(loss_on_shared(model.toy, hidden, a, b), abs=1e-5)


def test_identities_from_first_principles(trained):
    """Where the two texts agree, the first layer's input is the same in both: patching it changes
    nothing (0). Copying the first layer's input at every position where they differ makes the
    corrupted run the clean one (1), whatever the model; here each differing position alone does not."""
    model, clean, corrupt, p = trained
    a, b = clean.split(), corrupt.split()
    same = [t for t in range(len(a)) if a[t] == b[t]]
    differ = [t for t in range(len(a)) if a[t] != b[t]]
    assert p.fraction(p.residual)[0, same] == pytest.approx(0, abs=1e-6)
    x_clean = model.run([int(t) for t in a])[1][0]
    hidden, _, _ = model.run([int(t) for t in b], resume=(1, x_clean))
    metric = parse_metric(model, "loss")
    targets = {t: int(a[t + 1]) for t in range(len(a) - 1) if a[t + 1] == b[t + 1]}
    assert metric(model, hidden, targets)[0] == pytest.approx(p.clean_value, abs=1e-6)
    assert len(differ) == len(a) // 2 - sum(a[t] == b[t] for t in range(len(a) // 2))


def test_the_induction_heads_carry_the_repeat(trained):
    """Re-drawing the probe's first half breaks the copy: the second layer's heads (the induction
    heads read the earlier copy) restore most of the loss gap, the first layer's little."""
    _, _, _, p = trained
    f = p.fraction(p.heads)
    assert p.corrupt_value > p.clean_value
    assert f[1].max() >= 0.3 and f[1].max() > f[0].max()


def test_smollm2_moves_the_name_from_s2_to_the_end(cli):
    """The indirect-object sentence (Wang et al. 2022): SmolLM2 prefers the right name in the clean
    text and the other in the corrupted one; the only position that differs carries all of it at the
    first layer, and by the last layers the final position does."""
    data = json.loads(cli("patch", "--model", "smollm2", "--by-input", "--by-position", "24.4",
                          "--format", "json").stdout)
    assert data["clean"]["metric"] > 0 > data["corrupt"]["metric"]
    residual = np.array(data["residual"]["fraction"])  # (layers, positions)
    differ = [t for t, (x, y) in enumerate(zip(data["clean"]["tokens"], data["corrupt"]["tokens"])) if x != y]
    assert differ == [9] and residual[0, 9] == pytest.approx(1, abs=1e-5)
    assert residual[0, :9] == pytest.approx(0, abs=1e-6)  # before it, both texts are the same
    assert residual[-1, -1] >= 0.9 and abs(residual[-1, 9]) < 0.1
    assert (residual[:20, 9] > 0.95).all() and (residual[24:, -1] > 0.9).all()  # the guide's story
    from pathlib import Path

    guide = (Path(__file__).parent.parent / "docs" / "patching.md").read_text()
    f = np.array(data["heads"]["fraction"])
    top = np.argsort(-np.abs(f).ravel(), kind="stable")[:3]
    assert f"({data['clean']['metric']:.4f})" in guide and f"({data['corrupt']['metric']:.4f})" in guide
    for i in top:
        assert f"{i // 9 + 1}.{i % 9 + 1} {f.ravel()[i]:+.2f} (" in " ".join(guide.split())
    said = " ".join(guide.split())  # --by-input and --by-position, as the guide tells them
    q, kv = (np.array(data[k]["fraction"]) for k in ("queries", "kv_groups"))
    at = data["by_position"]["fraction"]
    assert f"its queries alone {q[23, 3]:+.0%}".replace("-", "−") in said
    assert f"its K/V group (2, heads 4-6) restores {kv[23, 1]:.0%}" in said and data["kv_groups"]["query_heads_each"] == 3
    assert f"{at[-1]:.0%} of the gap at the last position, {at[10]:.0%} at" in said
    rho = data["heads"]["spearman_exact_vs_attribution"]
    assert rho >= 0.8 and f"Spearman ρ = {rho:.2f} on SmolLM2" in " ".join(guide.split())
    text = cli("patch", "--model", "smollm2", "--clean", "The capital of France is", "--corrupt",  # the
               "The capital of Italy is", "--metric", "logit-diff: Paris, Rome",  # README's shorter pair:
               "--width", "100").stdout  # the layout, every layer in one in 3
    assert max(len(line) for line in text.splitlines()) <= 100 and "one layer in 3" in text


def test_noising_copies_the_other_way(trained, cli, default_run):
    """Noising: the corrupted run's activation into the clean one; a text that differs at one
    position only, patched there at the first layer, becomes the other run entirely (1)."""
    model, clean, _, _ = trained
    ids = clean.split()
    one = " ".join(ids[:20] + [str((int(ids[20]) + 1) % 16)] + ids[21:])
    for way in ((), ("--noising",)):
        data = json.loads(cli("patch", "--checkpoint", str(default_run), "--corrupt", one, "--clean", clean,
                              "--metric", "loss", *way, "--format", "json").stdout)
        assert data["direction"] == ("noising" if way else "denoising")
        assert np.array(data["residual"]["fraction"])[0, 20] == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize("args,message", [
    (("--clean", "The cat sat"), "--clean and --corrupt go together (or neither: the default pair)"),
    (("--clean", "The cat sat on the mat", "--corrupt", "The dog sat", "--metric", "loss"),
     "--corrupt: the clean and the corrupted text must be the same length in tokens to patch position by "
     "position: 6 and 3"),
    (("--metric", "logit-diff:Paris"), "--metric 'logit-diff:Paris' is not 'loss' or 'logit-diff:A,B' "
                                      "(e.g. logit-diff: Paris, London)"),
    (("--metric", "logit-diff: Mary, Zanzibarian"), "--metric word ' Zanzibarian' is 4 tokens for "
     "SmolLM2-135M-Instruct; a logit difference compares single tokens (a leading space often makes one)"),
    (("--clean", " ".join(["The cat sat on the mat and"] * 6), "--corrupt", " ".join(["The dog sat on the mat and"] * 6),
      "--metric", "loss"), "--clean: patch runs SmolLM2-135M-Instruct over 514 copies of 42 tokens: about 102 s on 2 "
                           "cores, and the guard stops at 30 s (12 tokens fit); shorten the sentence, or --max-seconds "
                           "103 goes on anyway"),
    (("--clean", "", "--corrupt", ""), "--clean text is empty: give a text to run"),
    (("--metric", "induction"), "--metric induction scores one receiving head: give --sender and --receiver "
                                "(path patching)"),
    (("--by-position", "31.1"), "--by-position: head 31.1 is out of range (SmolLM2-135M-Instruct has layers 1 to 30 "
                                "and heads 1 to 9 in each)"),
    (("--sender", "1.1,", "--receiver", "2.4"), "--sender: head '' is not LAYER.HEAD, e.g. 4.1 (layer 4, head 1)"),
    (("--sender", "1.1", "--receiver", "2.4", "--by-input"), "--sender does not go with --by-input (--by-input and "
                                                             "--by-position patch every head; path patching follows one path)"),
    (("--metric", ""), "--metric '' is not 'loss', 'logit-diff:A,B' or, with --receiver, 'induction'"),
    (("--sender", "1.1", "--receiver", "2.4,2.5"), "--receiver is one head, LAYER.HEAD (several senders may share it)"),
    (("--clean", "The cat", "--corrupt", "A dog", "--metric", "loss", "--sender", "1.1", "--receiver", "2.1"),
     "--metric: the loss is taken over the next tokens both texts share, and these share none: corrupt fewer "
     "tokens, or use logit-diff:A,B"),
    (("--model", "minilm"), "--model: patch scores a causal model's next token; all-MiniLM-L6-v2 is an encoder "
                            "(try --model smollm2 or --checkpoint run.pt)"),
])
def test_patch_errors(cli, args, message):
    result = cli("patch", *args)
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")


def test_path_patching_is_the_receivers_weights_written_out(trained, cli, default_run):
    """Sender 1.h's output difference (clean − corrupted) added to the receiver's key input only:
    its weights by hand, from the corrupted run's second-layer input, give the induction score
    patch reports; through the values nothing in the weights moves (exactly the corrupted score)."""
    model, clean, corrupt, _ = trained
    a, b = (torch.tensor([int(t) for t in text.split()]) for text in (clean, corrupt))
    toy, T, half = model.toy, len(a), len(a) // 2
    block1, block2 = toy.blocks
    d = block2.d_k
    for senders, receiver in (((1,), 4), ((2,), 2), ((1, 3), 2)):  # several senders: their sum
        data = json.loads(cli("patch", "--checkpoint", str(default_run), "--sender", ",".join(f"1.{s}" for s in senders),
                              "--receiver", f"2.{receiver}", "--format", "json").stdout)
        with torch.no_grad():
            _, ctx_a = by_hand(toy, a)
            _, ctx_b = by_hand(toy, b)
            delta = 0
            for sender in senders:
                cols = slice((sender - 1) * d, sender * d)
                delta = delta + (ctx_a[0][:, cols] - ctx_b[0][:, cols]) @ block1.W_o.weight[:, cols].T
            x2 = toy.embed(b) + toy.position.weight[:T] + block1.W_o(ctx_b[0])
            r = slice((receiver - 1) * d, receiver * d)
            for via, (xq, xk) in {"k": (x2, x2 + delta), "q": (x2 + delta, x2), "v": (x2, x2)}.items():
                q, k = block2.W_q(xq)[:, r], block2.W_k(xk)[:, r]
                scores = (q @ k.T / math.sqrt(d)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
                w = scores.softmax(-1)
                score = sum(w[t, t - half + 1] for t in range(half, T)).item() / (T - half)
                assert data["via"][via]["metric"] == pytest.approx(score, abs=1e-6)
        assert data["via"]["v"]["metric"] == pytest.approx(data["corrupt"], abs=1e-9)


def test_the_induction_heads_read_the_previous_token_head_through_their_keys(cli, default_run):
    """The induction circuit, proved on the default run: for each induction head, the layer-1
    head whose output restores most of its induction score through its keys is the one survey
    --composition names as its strongest K partner; through the keys the best restores half or
    more, through the queries at most a tenth."""
    composition = json.loads(cli("survey", "--checkpoint", str(default_run), "--composition",
                                 "--format", "json").stdout)
    partners = {"{}.{}".format(*c["head"]): "{}.{}".format(*c["k_partner"]) for c in composition["induction_heads"]}
    assert partners
    through_keys = []
    for receiver, partner in partners.items():
        shares = {}
        for sender in range(1, 5):
            data = json.loads(cli("patch", "--checkpoint", str(default_run), "--sender", f"1.{sender}",
                                  "--receiver", receiver, "--format", "json").stdout)
            shares[f"1.{sender}"] = data["via"]
        best = max(shares, key=lambda s: shares[s]["k"]["fraction"])
        assert best == partner and abs(shares[best]["q"]["fraction"]) <= 0.1
        assert shares[best]["v"]["fraction"] == pytest.approx(0, abs=1e-9)
        through_keys.append(shares[best]["k"]["fraction"])
    assert max(through_keys) >= 0.5 and min(through_keys) >= 0.3
    from pathlib import Path

    guide = " ".join((Path(__file__).parent.parent / "docs" / "patching.md").read_text().split())
    shares = ", ".join(f"{x:.0%}" for x in [dict(zip(partners, through_keys))[h] for h in sorted(partners)])
    assert f"restores {shares.rsplit(', ', 1)[0]} and {shares.rsplit(', ', 1)[1]} of the induction score gap" in guide


def test_attribution_is_the_gradient_times_each_heads_change(trained):
    """Attribution patching, by hand: the corrupted run's loss written out, its gradient with
    respect to each layer's context by torch.autograd, times (clean − corrupted context), summed
    over each head's slice; its ranking of the heads follows the exact patches'."""
    model, clean, corrupt, p = trained
    a, b = ([int(t) for t in text.split()] for text in (clean, corrupt))
    toy, T = model.toy, len(b)
    with torch.no_grad():
        _, clean_contexts = by_hand(toy, torch.tensor(a))
    contexts = []  # the weights are frozen: the input requires a gradient so that all after it do
    x = (toy.embed(torch.tensor(b)) + toy.position.weight[:T]).detach().requires_grad_(True)
    for block in toy.blocks:
        H, d = block.heads, block.d_k
        q, k, v = (w(x).view(T, H, d).transpose(0, 1) for w in (block.W_q, block.W_k, block.W_v))
        scores = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(
            ~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        context = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, H * d)
        context.retain_grad()  # its gradient, every later path through it kept
        contexts.append(context)
        x = x + block.W_o(context)
    at = [t for t in range(T - 1) if a[t + 1] == b[t + 1]]
    loss = torch.nn.functional.cross_entropy(toy.unembed(x[at]), torch.tensor([a[t + 1] for t in at]))
    loss.backward()
    for layer, (context, source) in enumerate(zip(contexts, clean_contexts)):
        d = toy.blocks[layer].d_k
        change = ((source - context.detach()) * context.grad).sum(0).view(-1, d).sum(-1)
        assert p.attribution[layer] == pytest.approx((loss.detach() + change).numpy(), abs=1e-5)
    assert p.rank_correlation >= 0.8
    from pathlib import Path

    guide = " ".join((Path(__file__).parent.parent / "docs" / "patching.md").read_text().split())
    assert f"{p.rank_correlation:.2f} on the trained run's probe" in guide


def test_a_pair_without_a_gap_says_so_and_a_bad_run_text_names_its_option(cli, default_run, kept_slides):
    """No gap (the two runs score the same): no share is defined, said in words in the terminal,
    null with its reason in the JSON and the page, a word on the slide; never a number."""
    from mha_trace.render import patching_slide

    same = cli("patch", "--checkpoint", str(default_run), "--clean", "1 2 3", "--corrupt", "1 2 4", "--metric", "loss")
    text = " ".join(same.stdout.split())
    assert "there is no gap to take a share of: no share is defined (—)" in text and not NAN.search(text)
    bad = cli("patch", "--checkpoint", str(default_run), "--clean", "a b", "--corrupt", "1 2")
    assert bad.exit_code == 2 and bad.stderr.startswith("Error: --clean: this run's text is token ids 0 to 15")
    twice = cli("patch", "--checkpoint", str(default_run), "--clean", "1 2 3 4", "--corrupt", "1 2 3 4",
                "--by-input", "--by-position", "2.1", "--format", "json")  # the same text: nothing to copy
    data = strict_json(twice.stdout)
    assert data["fraction_undefined"] == "the two runs score the same: there is no gap to take a share of"
    for key in ("residual", "heads", "queries", "kv_groups", "by_position"):
        assert {x for x in np.ravel(np.array(data[key]["fraction"], dtype=object))} == {None}, key
        assert np.array(data[key]["metric"]) == pytest.approx(data["clean"]["metric"], abs=1e-6), key
    assert data["heads"]["spearman_exact_vs_attribution"] is None
    assert data["heads"]["spearman_exact_vs_attribution_undefined"] == "no gap, no shares to rank"
    made = kept_slides(patching_slide)
    assert cli("patch", "--checkpoint", str(default_run), "--clean", "1 2 3 4", "--corrupt", "1 2 3 4",
               "--png", "p.png").exit_code == 0
    assert "no share is defined" in made[-1]._suptitle.get_text()
    assert {t.get_text() for ax in made[-1].axes for t in ax.texts} <= {"—"}  # no ring, no number
    laid_out(made[-1])
    text = cli("patch", "--checkpoint", str(default_run), "--clean", "1 2 3 4", "--corrupt", "1 2 3 4").stdout
    assert "The two texts are the same, token for token." in " ".join(text.split())
    path = cli("patch", "--checkpoint", str(default_run), "--clean", "1 2 3 4", "--corrupt", "1 2 3 4",
               "--sender", "1.1", "--receiver", "2.1", "--format", "json")
    assert [v["fraction"] for v in strict_json(path.stdout)["via"].values()] == [None] * 4


NAN = re.compile(r"\b(nan|inf)\b", re.IGNORECASE)  # a number that is none, shown


def strict_json(text: str):
    """JSON as a strict parser reads it: NaN, Infinity and -Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_texts_a_metric_cannot_score_are_refused_before_the_patch_runs(cli, default_run):
    """Path patching's loss over texts that share no next token, and the induction score of a text
    too short to repeat itself: one line each (a ZeroDivisionError and an IndexError before)."""
    run = ("patch", "--checkpoint", str(default_run), "--sender", "1.1", "--receiver", "2.1")
    loss = cli(*run, "--clean", "1 2 3 4", "--corrupt", "5 6 7 8", "--metric", "loss")
    assert (loss.exit_code, loss.stderr) == (2, "Error: --metric: the loss is taken over the next tokens both "
                                                "texts share, and these share none: corrupt fewer tokens, or use "
                                                "logit-diff:A,B\n")
    short = cli(*run, "--clean", "1", "--corrupt", "2", "--metric", "induction")
    assert (short.exit_code, short.stderr) == (2, "Error: --metric: induction scores a text whose second half "
                                                  "repeats its first: it needs at least 4 tokens, and the texts "
                                                  "have 1\n")


@pytest.fixture(scope="module")
def one_head_run(tmp_path_factory):
    """A run of one layer of one head, trained a few steps: one head, so nothing to rank."""
    import mha_trace

    path = tmp_path_factory.mktemp("one-head") / "one.pt"
    mha_trace.train("induction", layers=1, heads=1, d_model=16, steps=3, snapshots=2, save=str(path))
    return path


def test_spearman_over_one_head_is_undefined_and_said_so_everywhere(cli, one_head_run, tmp_path):
    """Spearman's ρ over one head: words in the terminal, null with its reason in the JSON and the
    page's data (JSON.parse read NaN as an error), nothing on stderr (NumPy warned)."""
    text = cli("patch", "--checkpoint", str(one_head_run))
    assert text.exit_code == 0 and text.stderr == ""
    said = " ".join(text.stdout.split())
    assert "Spearman's ρ is undefined: one head, nothing to rank" in said and not NAN.search(said)
    data = strict_json(cli("patch", "--checkpoint", str(one_head_run), "--format", "json").stdout)
    assert data["heads"]["spearman_exact_vs_attribution"] is None
    assert data["heads"]["spearman_exact_vs_attribution_undefined"] == "one head, nothing to rank"
    assert cli("patch", "--checkpoint", str(one_head_run), "--html", str(tmp_path / "p.html")).exit_code == 0
    page = (tmp_path / "p.html").read_text()
    payload = page.split('id="mha-data">')[1].split("</script>")[0]
    assert strict_json(payload)["spearman"] is None


def smollm2_attention_by_hand(attention, x, source, group=None, query_head=None):
    """One SmolLM2 attention layer written out with every query head holding its own copy of its
    group's keys and values (repeat_interleave first, RoPE after): a K/V group patched is the keys
    and values of its query heads, all of them, from the source's input; a query head patched is
    its own queries. x, source: the layer's normed input in the target and the source run."""
    T, H, G, d = x.size(1), attention.heads, attention.kv_heads, attention.d_k
    share = H // G

    def heads_of(W, inp, n):
        return W(inp).view(1, T, n, d).transpose(1, 2).repeat_interleave(H // n, dim=1)  # (1, H, T, d)

    (Q, K, V), (Qs, Ks, Vs) = ([heads_of(W, inp, n) for W, n in ((attention.W_q, H), (attention.W_k, G),
                                                                  (attention.W_v, G))] for inp in (x, source))
    for h in range(H):
        if group is not None and h // share == group:
            K[:, h], V[:, h] = Ks[:, h], Vs[:, h]
        if h == query_head:
            Q[:, h] = Qs[:, h]
    Q, K = (rope(t, 0, attention.rope_base) for t in (Q, K))
    scores = (Q @ K.transpose(-1, -2) / math.sqrt(d)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    context = (scores.softmax(-1) @ V).transpose(1, 2).reshape(1, T, H * d)
    return attention.W_o(context), torch.zeros(1, H, T, T)


def test_a_kv_group_patch_is_the_keys_and_values_of_its_query_heads_patched_jointly(monkeypatch):
    """GQA made explicit on SmolLM2 (3 K/V groups, 9 query heads a layer): the K/V-group grid equals
    the layer written out with the keys and values of the group's three query heads taken from the
    clean run together; the query grid, one head's queries alone. Where the texts first differ is
    position 3: the copies start there, from the cached prefix; the by-hand runs start at 0. (The
    guide's run, as `patch --by-input` makes it; its view of one head a position at a time, on the
    guide's indirect-object run.)"""
    import mha_trace
    from mha_trace.analyses import patching  # as the command calls it (the suite runs one call once)

    model = mha_trace.model("smollm2").model
    clean, corrupt = "The capital of France is", "The capital of Italy is"
    metric = parse_metric(model, "logit-diff: Paris, Rome")
    p = patching.patch(model, clean, corrupt, metric, by_input=True)
    a, b = model.tokenize(clean), model.tokenize(corrupt)
    assert p.kv_groups.shape == (30, 3) and p.queries.shape == (30, 9)
    with torch.no_grad():
        source_inputs, target_inputs = model.run(a)[1], model.run(b)[1]
        for layer, group, head in ((24, 1, 0), (21, 0, 4), (2, 2, 8)):
            block = model.blocks[layer - 1]
            source = block.attention_norm(source_inputs[layer - 1])
            for kind, grid, at, options in (("kv", p.kv_groups, group, {"group": group}),
                                            ("q", p.queries, head, {"query_head": head})):
                monkeypatch.setattr(block.attention, "forward", lambda q, mask=None, cache=None:
                                    smollm2_attention_by_hand(block.attention, q, source, **options))
                hidden, _, _ = model.run(b, resume=(layer, target_inputs[layer - 1]))
                monkeypatch.undo()
                by_hand_value = metric(model, hidden, {})[0]  # float32 through 30 layers: the share to 1e-5
                assert grid[layer - 1, at] == pytest.approx(by_hand_value, abs=1e-4), (kind, layer)
                assert p.fraction(grid[layer - 1, at]) == pytest.approx(p.fraction(by_hand_value), abs=1e-5)
    f = p.fraction(p.kv_groups)
    assert abs(f[23, 1]) > 0.05  # the test is not of zeros: layer 24's second group carries some
    text = str(p)  # the view says what a group is
    assert "One K/V group serves 3 query heads (3 groups, 9 heads a layer)" in " ".join(text.split())
    assert "2 (heads 4-6)" in text and p.by_position is None
    ioi = patching.patch(model, *default_pair(model)[:2], parse_metric(model, default_pair(model)[2]),
                         by_input=True, by_position=(24, 4))
    assert ioi.by_position[0] == (24, 4) and ioi.by_position[1][:9] == pytest.approx(ioi.corrupt_value, abs=0)
    assert "Head 24.4's output, one position at a time" in str(ioi)


def test_one_heads_output_one_position_at_a_time_is_the_forward_pass_written_out(default_run):
    """--by-position on the trained run: head 2.1's clean output at one position alone, checked
    against the by-hand forward pass at every position."""
    model = Trained(str(default_run), None)
    clean, corrupt, metric = default_pair(model)
    p = patch(model, clean, corrupt, parse_metric(model, metric), by_position=(2, 1))
    a, b = ([int(t) for t in text.split()] for text in (clean, corrupt))
    with torch.no_grad():
        _, clean_contexts = by_hand(model.toy, torch.tensor(a))
        for t in range(len(a)):
            hidden, _ = by_hand(model.toy, torch.tensor(b), 2, 0, clean_contexts[1], rows=slice(t, t + 1))
            assert p.by_position[1][t] == pytest.approx(loss_on_shared(model.toy, hidden, a, b), abs=1e-5)
    assert np.ptp(p.by_position[1]) > 0.01  # some positions carry more than others


def test_the_slides_draw_the_shares_json_gives(cli, default_run, kept_slides):
    """`patch --png`: the residual stream, every head and every K/V group on one scale from −1 to
    1, each share written in its cell (a small grid); path patching's four inputs as bars."""
    from mha_trace.render import patching_slide

    made = kept_slides(patching_slide)
    args = ("patch", "--checkpoint", str(default_run), "--by-input")
    data = json.loads(cli(*args, "--format", "json").stdout)
    assert cli(*args, "--png", "p.png").exit_code == 0
    laid_out(made[-1])
    axes = [ax for ax in made[-1].axes if ax.get_title()]
    assert [ax.get_title() for ax in axes] == ["residual stream", "heads' outputs", "K/V groups"]
    for ax, key in zip(axes[1:], ("heads", "kv_groups")):
        image = ax.get_images()[0]
        np.testing.assert_allclose(image.get_array(), data[key]["fraction"], atol=1e-6)
        assert image.get_clim() == (-1, 1)
        assert [t.get_text() for t in ax.texts] == [f"{x:.2f}" if round(x, 2) else "0.00"
                                                    for x in np.ravel(data[key]["fraction"])]
    np.testing.assert_allclose(axes[0].get_images()[0].get_array(), np.array(data["residual"]["fraction"]).T, atol=1e-6)
    path = ("patch", "--checkpoint", str(default_run), "--sender", "1.2", "--receiver", "2.4")
    via = json.loads(cli(*path, "--format", "json").stdout)["via"]
    assert cli(*path, "--png", "q.png").exit_code == 0
    laid_out(made[-1])
    bars = [patch.get_width() for patch in made[-1].axes[0].patches]
    assert bars == pytest.approx([via[k]["fraction"] for k in ("q", "k", "v", "qkv")], abs=1e-6)  # JSON: 6 places


PATCHING_REFERENCE = np.load(Path(__file__).parent / "fixtures" / "patching_reference.npz")
PAIRS = json.loads(str(PATCHING_REFERENCE["meta"]))["pairs"]


@pytest.mark.parametrize("i", range(len(PAIRS)))
def test_every_heads_patch_on_smollm2_equals_transformers_hooks(i):
    """Against an independent reference: transformers' LlamaForCausalLM (eager, float32) with a
    forward pre-hook on each layer's o_proj, one pass a head (tests/fixtures/make_patching_reference.py),
    on 10 prompt pairs (one test each): the heads' denoising values, and the clean and corrupted
    metrics, within 1e-4 (the batched, prefix-cached copies change no number). The README's pair
    and the guide's indirect-object run go through `patch` as those run them (the suite runs each
    once): every one of the 270 heads. The other eight go through the same copies with the head
    grid's edits alone, the residual grid and the attribution left out, each on every head of one
    layer in 3 (pair i from layer 1 + i mod 3): each layer's heads on two or three of them besides."""
    import mha_trace
    from mha_trace.analyses import patching  # as the command calls it (the suite runs one call once)

    reference, (clean, corrupt, a, b) = PATCHING_REFERENCE, PAIRS[i]
    model = mha_trace.model("smollm2").model
    assert len(PAIRS) >= 10
    assert model.tokenize(clean) == reference[f"p{i}_clean_ids"].tolist()
    assert model.tokenize(corrupt) == reference[f"p{i}_corrupt_ids"].tolist()
    metric = parse_metric(model, f"logit-diff:{a},{b}")
    run_elsewhere = {README_PAIR: {},  # and as `patch --model smollm2 --by-input --by-position 24.4`:
                     default_pair(model)[:2]: {"by_input": True, "by_position": (24, 4)}}
    layers = list(range(1, model.layers + 1))
    if (clean, corrupt) in run_elsewhere:
        p = patching.patch(model, clean, corrupt, metric, **run_elsewhere[clean, corrupt])
        values, heads = (p.clean_value, p.corrupt_value), p.heads
    else:
        layers = layers[i % 3::3]
        values, heads = _head_grid(model, clean, corrupt, metric, layers)
    clean_value, corrupt_value = reference[f"p{i}_values"]
    expected = reference[f"p{i}_heads"][np.array(layers) - 1]
    assert values == pytest.approx((clean_value, corrupt_value), abs=1e-4)
    np.testing.assert_allclose(heads, expected, atol=1e-4, rtol=0)
    shares = (expected - corrupt_value) / (clean_value - corrupt_value)
    np.testing.assert_allclose((heads - values[1]) / (values[0] - values[1]), shares, atol=1e-4, rtol=0)


README_PAIR = ("The capital of France is", "The capital of Italy is")


def _head_grid(model, clean: str, corrupt: str, metric, layers: list) -> tuple:
    """((clean, corrupted) metric, (len(layers), heads) denoising grid) from patching's own
    copies, each head's output taken from the clean run, as `patch` makes its head grid."""
    from mha_trace.analyses.patch_inputs import capture, texts_of
    from mha_trace.analyses.patching import _Copies

    (clean_ids, _, _), (corrupt_ids, _, _) = texts_of(model, clean, corrupt)
    with model.resident(), torch.no_grad():
        source, target = capture(model, clean_ids), capture(model, corrupt_ids)
        copies = _Copies(model, corrupt_ids, clean_ids, source, target, metric, {})
        found = copies.run({layer: [("head", h, None) for h in range(model.heads)] for layer in layers})
        values = tuple(float(metric(model, run.hidden, {})[0]) for run in (source, target))
    return values, np.array([found[layer] for layer in layers])


def test_the_copies_of_many_layers_share_a_pass_and_split_into_passes_alike(trained, monkeypatch):
    """A layer's copies join the batch as the pass reaches it; a batch that would outgrow
    COPY_TOKENS starts a new pass. One pass a layer gives the same numbers."""
    from mha_trace.analyses import patching

    model, clean, corrupt, p = trained
    monkeypatch.setattr(patching, "COPY_TOKENS", 1)
    apart = patch(model, clean, corrupt, parse_metric(model, "loss"), by_position=(2, 2))
    np.testing.assert_allclose(apart.heads, p.heads, atol=1e-6)
    np.testing.assert_allclose(apart.residual, p.residual, atol=1e-6)


def test_the_api_takes_senders_as_one_string_or_a_list(default_run):
    import mha_trace

    m = mha_trace.model(str(default_run))
    together = m.patch(sender="1.1,1.2", receiver="2.4")
    assert together.sender_names == "1.1 + 1.2" and together.data()["sender"] == "1.1,1.2"
    assert m.patch(sender=["1.2", "1.1"], receiver="2.4").via == pytest.approx(together.via, abs=1e-9)
    with pytest.raises(mha_trace.MhaError) as e:
        m.patch(sender="1.1,x", receiver="2.4")
    assert e.value.quantity == "sender"
