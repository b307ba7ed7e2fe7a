"""One door per view: for the same request, the Python API's record holds the same data as the
command line's `--format json`, over a table that covers every view and every kind of source (flags,
a config, a module, MiniLM, SmolLM2, a trained run, Whisper's recording); and a refusal is worded the
same on both sides. Both front ends build a request and call the view (mha_trace/views/); this
table catches a front end that builds another request, drops an option or words a clash its own way."""

import json

import pytest

import mha_trace

CAT = "examples/audio/cat.wav"
IT = "The animal didn't cross the street because it was too tired."
RUN = "{run}"  # the default trained run, saved once for the session


def _model(name):
    return mha_trace.model(name)


ROWS = [  # (id, the command line's arguments, the API's call, the options its data() is shown with)
    ("heads-chapter", ["heads"], lambda r: mha_trace.heads(), {"decimals": 4}),
    ("heads-config-head", ["heads", "--config", "chicken-road", "--head", "3", "--effect"],
     lambda r: mha_trace.heads("chicken-road", head=3, effect=True), {"decimals": 4, "head": 3}),
    ("heads-resplit-mask", ["heads", "--heads", "1", "--mask", "causal", "--rope"],
     lambda r: mha_trace.heads(heads=1, mask="causal", rope=True), {"decimals": 4}),
    ("heads-module", ["heads", "--module", "example:chapter_torch"],
     lambda r: mha_trace.heads(module="example:chapter_torch"), {"decimals": 4}),
    ("heads-minilm", ["heads", "--model", "minilm", "--head", "4.1", "--effect"],
     lambda r: _model("minilm").heads(head="4.1", effect=True), {"decimals": 4}),
    ("heads-minilm-words", ["heads", "--model", "minilm", "--layer", "2", "--words", "--hide-special"],
     lambda r: mha_trace.heads(model="minilm", layer=2, words=True, hide_special=True), {"decimals": 4}),
    ("heads-whisper-cross", ["heads", "--model", "whisper", "--audio", CAT, "--head", "4.3"],
     lambda r: _model("whisper").heads(audio=CAT, head="4.3"), {}),
    ("heads-whisper-encoder", ["heads", "--model", "whisper", "--audio", CAT, "--attention", "encoder"],
     lambda r: _model("whisper").heads(audio=CAT, attention="encoder"), {}),
    ("heads-trained", ["heads", "--checkpoint", RUN, "--layer", "2"],
     lambda r: _model(r).heads(layer=2), {"decimals": 4}),
    ("explain-chapter", ["explain", "--token", "cat", "--head", "2"],
     lambda r: mha_trace.explain(token="cat", head=2), {"decimals": 4, "head": 2}),
    ("explain-why", ["explain", "--token", "cat", "--why", "--effect"],
     lambda r: mha_trace.explain(token="cat", why=True, effect=True), {"decimals": 4}),
    ("explain-tiled", ["explain", "--token", "cat", "--impl", "tiled", "--block-k", "2"],
     lambda r: mha_trace.explain(token="cat", impl="tiled", block_k=2), {"decimals": 4}),
    ("explain-rope-planes", ["explain", "--rope", "--config", "chicken-road", "--token", "it",
                             "--rope-planes", "--head", "1"],
     lambda r: mha_trace.explain("chicken-road", token="it", rope=True, rope_planes=True, head=1),
     {"decimals": 4, "head": 1}),
    ("explain-scored", ["explain", "--token", "cat", "--qk-norm", "--softcap", "1", "--sink-logits"],
     lambda r: mha_trace.explain(token="cat", qk_norm=True, softcap=1.0, sink_logits=True), {"decimals": 4}),
    ("heads-off-by-one", ["heads", "--off-by-one", "--mask", "causal"],
     lambda r: mha_trace.heads(off_by_one=True, mask="causal"), {"decimals": 4}),
    ("explain-module", ["explain", "--module", "example:chapter_torch", "--token", "sat", "--why"],
     lambda r: mha_trace.explain(module="example:chapter_torch", token="sat", why=True), {"decimals": 4}),
    ("explain-minilm", ["explain", "--model", "minilm", "--token", "it", "--head", "3.1", "--why"],
     lambda r: _model("minilm").explain(token="it", head="3.1", why=True), {"decimals": 4, "head": 1}),
    ("explain-whisper", ["explain", "--model", "whisper", "--audio", CAT, "--token", "mat"],
     lambda r: _model("whisper").explain(audio=CAT, token="mat"), {}),
    ("explain-whisper-self", ["explain", "--model", "whisper", "--audio", CAT, "--attention", "self",
                              "--token", "mat", "--head", "2.3"],
     lambda r: _model("whisper").explain(audio=CAT, attention="self", token="mat", head="2.3"),
     {"decimals": 4, "head": 3}),
    ("shapes-sizes", ["shapes", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--mask", "causal"],
     lambda r: mha_trace.trace_sizes(d_model=64, heads=4, kv_heads=2, mask="causal"), {}),
    ("shapes-scored", ["shapes", "--d-model", "32", "--heads", "2", "--qk-norm", "--softcap", "30", "--off-by-one"],
     lambda r: mha_trace.trace_sizes(d_model=32, heads=2, qk_norm=True, softcap=30, off_by_one=True), {}),
    ("shapes-latent", ["shapes", "--latent", "16", "--absorbed", "--d-model", "64", "--heads", "4"],
     lambda r: mha_trace.trace_sizes(latent=16, absorbed=True, d_model=64, heads=4), {}),
    ("explain-latent", ["explain", "--config", "chicken-road", "--latent", "16", "--absorbed", "--token", "it"],
     lambda r: mha_trace.explain(config="chicken-road", latent=16, absorbed=True, token="it"), {}),
    ("explain-partial-rope", ["explain", "--config", "chicken-road", "--rope", "--rope-dim", "4", "--token", "it"],
     lambda r: mha_trace.explain(config="chicken-road", rope=True, rope_dim=4, token="it"), {}),
    ("explain-relative-bias", ["explain", "--config", "chicken-road", "--relative-bias", "--token", "it"],
     lambda r: mha_trace.explain(config="chicken-road", relative_bias=True, token="it"), {}),
    ("heads-latent", ["heads", "--config", "animal-street", "--latent", "16"],
     lambda r: mha_trace.heads(config="animal-street", latent=16), {}),
    ("shapes-compact", ["shapes", "--compact"], lambda r: mha_trace.trace_sizes(compact=True), {}),
    ("shapes-tiled", ["shapes", "--impl", "tiled", "--compare-impl", "--seq", "6", "--block-q", "4"],
     lambda r: mha_trace.trace_sizes(impl="tiled", compare_impl=True, seq=6, block_q=4), {}),
    ("shapes-decode", ["shapes", "--decode", "2", "--mask", "causal", "--d-model", "32", "--heads", "2"],
     lambda r: mha_trace.trace_sizes(decode=2, mask="causal", d_model=32, heads=2), {}),
    ("shapes-minilm", ["shapes", "--model", "minilm", "--layer", "2"],
     lambda r: _model("minilm").trace(layer=2), {}),
    ("ablate-config", ["ablate", "--config", "chicken-road", "--head", "1,3"],
     lambda r: mha_trace.ablate("chicken-road", removed=(1, 3)), {"decimals": 4}),
    ("ablate-minilm", ["ablate", "--model", "minilm", "--head", "6.12,3.1"],
     lambda r: _model("minilm").ablate(removed=["6.12", "3.1"]), {"decimals": 4}),
    ("ablate-rank", ["ablate", "--checkpoint", RUN, "--rank"], lambda r: _model(r).rank(), {}),
    ("compare", ["compare", "--heads", "1,2"], lambda r: mha_trace.compare(head_counts=[1, 2]),
     {"decimals": 4}),
    ("survey-corpus", ["survey", "--model", "minilm"], lambda r: _model("minilm").survey(), {"top": 3}),
    ("survey-probe", ["survey", "--model", "minilm", "--sentence", IT, "--from", "it", "--to",
                      "animal,street"],
     lambda r: _model("minilm").survey(IT, source="it", targets=["animal", "street"]), {"top": 3}),
    ("survey-composition", ["survey", "--checkpoint", RUN, "--composition"],
     lambda r: _model(r).composition(), {}),
    ("survey-hear", ["survey", "--model", "whisper", "--audio", CAT, "--timestamps"],
     lambda r: _model("whisper").hear(CAT, timestamps=True), {}),
    ("predict", ["predict", "--model", "smollm2", "--top", "3"],
     lambda r: _model("smollm2").predict(top=3), {}),
    ("patch-path", ["patch", "--checkpoint", RUN, "--sender", "1.1", "--receiver", "2.4"],
     lambda r: _model(r).patch(sender="1.1", receiver="2.4"), {}),
    ("cache", ["cache", "--checkpoint", RUN, "--budget", "12,64"],
     lambda r: _model(r).cache(budgets=[12, 64]), {}),
    ("cost-hybrid", ["cost", "--preset", "gpt-oss-20b", "--seq", "4096", "--sinks", "4"],
     lambda r: mha_trace.cost(preset="gpt-oss-20b", seq=4096, sinks=4), {}),
    ("cost-scored", ["cost", "--qk-norm", "--diff", "--seq", "64"],
     lambda r: mha_trace.cost(qk_norm=True, diff=True, seq=64), {}),
    ("cost-io", ["cost", "--preset", "gpt2-medium", "--io", "--backward", "--causal"],
     lambda r: mha_trace.cost(preset="gpt2-medium", io=True, backward=True, causal=True), {}),
    ("train", ["train", "--task", "previous-token", "--steps", "30", "--snapshots", "3"],
     lambda r: mha_trace.train("previous-token", steps=30, snapshots=3), {}),
]


@pytest.mark.parametrize("args,call,options", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_the_api_and_the_command_line_give_the_same_record(cli, default_run, args, call, options):
    args = [str(default_run) if a == RUN else a for a in args]
    shown = json.loads(cli(*args, "--format", "json").stdout)
    record = call(str(default_run))
    assert shown.pop("schema_version") >= 1
    assert _steady(json.loads(json.dumps(record.data(**options)))) == _steady(shown)


def _steady(data):
    """The data without the wall time it took (the cache lab's seconds a setting)."""
    if isinstance(data, dict):
        return {k: _steady(v) for k, v in data.items() if k != "seconds"}
    return [_steady(v) for v in data] if isinstance(data, list) else data


REFUSED = [  # the command line's arguments, the API's call: the same request, refused in one wording
    (["explain", "--impl", "tiled", "--why"], lambda: mha_trace.explain(impl="tiled", why=True)),
    (["explain", "--block-k", "2"], lambda: mha_trace.explain(block_k=2)),
    (["explain", "--why", "--softcap", "2"], lambda: mha_trace.explain(why=True, softcap=2)),
    (["shapes", "--sink-logits", "--impl", "sdpa"], lambda: mha_trace.trace_sizes(sink_logits=True, impl="sdpa")),
    (["heads", "--sink-logits", "--off-by-one"], lambda: mha_trace.heads(sink_logits=True, off_by_one=True)),
    (["explain", "--by-head"], lambda: mha_trace.explain(by_head=True)),
    (["explain", "--model", "whisper", "--audio", CAT, "--impl", "tiled"],
     lambda: _model("whisper").explain(audio=CAT, impl="tiled")),
    (["heads", "--model", "whisper", "--audio", CAT, "--effect"],
     lambda: _model("whisper").heads(audio=CAT, effect=True)),
    (["heads", "--overview"], lambda: mha_trace.heads(overview=True)),
    (["shapes", "--compact", "--decode", "2", "--mask", "causal"],
     lambda: mha_trace.trace_sizes(compact=True, decode=2, mask="causal")),
    (["shapes", "--compare-impl"], lambda: mha_trace.trace_sizes(compare_impl=True)),
    (["ablate", "--module", "example:chapter_torch"], lambda: mha_trace.ablate(module="example:chapter_torch")),
    (["compare", "--heads", "1,x"], lambda: mha_trace.compare(head_counts="1,x")),
    (["survey", "--model", "minilm", "--from", "it"], lambda: _model("minilm").survey(source="it")),
    (["survey", "--model", "smollm2", "--rope-planes", "--induction"],
     lambda: _model("smollm2").survey(rope_planes=True, induction=True)),
    (["survey", "--model", "minilm", "--induction", "--effect"],
     lambda: _model("minilm").survey(induction=True, effect=True)),
    (["patch", "--sender", "1.1", "--receiver", "2.1", "--by-input"],
     lambda: _model("smollm2").patch(sender="1.1", receiver="2.1", by_input=True)),
    (["patch", "--model", "smollm2", "--by-position", "31.1"],
     lambda: _model("smollm2").patch(by_position="31.1")),
    (["cache", "--policy", "full,nosuch"], lambda: _model("smollm2").cache(policies="full,nosuch")),
    (["cache", "--budget", "4", "--sinks", "4"], lambda: _model("smollm2").cache(budgets=[4], sinks=4)),
    (["cost", "--sinks", "2"], lambda: mha_trace.cost(sinks=2)),
    (["train", "--resume", "run.pt", "--heads", "2"], lambda: mha_trace.train(resume="run.pt", heads=2)),
]


@pytest.mark.parametrize("args,call", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_a_refusal_says_the_same_on_both_sides(cli, args, call):
    result = cli(*args)
    with pytest.raises(mha_trace.MhaError) as refused:
        call()
    assert result.exit_code == 2
    assert refused.value.message in result.stderr, (result.stderr, refused.value.message)
