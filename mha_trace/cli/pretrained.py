"""`--model` on heads, explain, shapes and ablate, and the `survey` command: a pretrained model's
real heads. The commands in views.py and tracing.py hand over here when --model is given.
"""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.errors import MhaError
from mha_trace.output import Output, emit

DEFAULT_SENTENCE = "The animal didn't cross the street because it was too tired."


def refuse_with_model(**given) -> None:
    """Options that describe another source of a run make no sense beside --model."""
    clash = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
    if clash:
        raise MhaError(f"{', '.join(clash)} {'does' if len(clash) == 1 else 'do'} not go with "
                       f"--model (a pretrained model fixes its own sizes, weights and input)")


def needs_model(sentence, layer, **flags) -> None:
    for name, value in (("sentence", sentence), ("layer", layer), *flags.items()):
        if value not in (None, False):
            raise MhaError(f"--{name.replace('_', '-')} goes with --model (e.g. --model minilm)")


def encode(model: str, sentence: str | None):
    from mha_trace.models import load

    return load(model).encode(DEFAULT_SENTENCE if sentence is None else sentence)


def _layer(s, layer: int) -> int:
    if not 1 <= layer <= s.model.layers:
        raise MhaError(f"layer {layer} is out of range ({s.model.name} has layers 1 to "
                       f"{s.model.layers})", quantity="layer")
    return layer


def heads(model, sentence, layer, head, overview, words, hide_special, decimals, out: Output):
    import numpy as np

    from mha_trace.models import parse_head
    from mha_trace.probes import check_heads
    from mha_trace.render.model import head_tables, heads_data, overview as draw_overview
    from mha_trace.render.model import word_weights

    s = encode(model, sentence)
    tokens, weights = list(s.labels), s.weights
    if words:
        tokens, weights = word_weights(s, weights)
    if hide_special:
        keep = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
        tokens, weights = [tokens[i] for i in keep], weights[..., keep, :][..., :, keep]
    if head is not None:
        picked = [parse_head(head)]
        check_heads(s.model, picked)
    elif layer is not None:
        picked = [(_layer(s, layer), h) for h in range(1, s.model.heads + 1)]
    else:
        picked = [(l, h) for l in range(1, s.model.layers + 1) for h in range(1, s.model.heads + 1)]
    whole = head is None and layer is None
    if out.png and whole:
        import sys

        from mha_trace.files import check_outputs
        from mha_trace.plots import layer_paths, save_model

        for path in layer_paths(out.png, s.model.layers):  # the files beside --png, checked too
            check_outputs({"png": path, "svg": out.svg, "html": out.html}, [])
        written = save_model(out.png, f"{s.model.name}: \"{s.text}\"", tokens, weights,
                             s.model.causal, decimals, out.theme)
        sys.stderr.write(f"Wrote {written[0]} (every head) and {written[1]} to {written[-1]} "
                         f"(one figure per layer)\n")
    elif out.png:
        from mha_trace.plots import save_heatmaps

        save_heatmaps(out.png, f"{s.model.name}: {s.text}",
                      [(f"head {l}.{h}", tokens, tokens, weights[l - 1, h - 1], None)
                       for l, h in picked], decimals, out.theme)
    data = heads_data(s, tokens, weights, picked, decimals, words)
    if whole:
        from mha_trace.output import make_console

        emit(out, draw_overview(s, tokens, weights, make_console(out).width), data)
        return
    if overview:
        raise MhaError("--overview shows every head; it does not go with --layer or --head")
    where = f"layer {picked[0][0]}" if len(picked) > 1 else f"head {picked[0][0]}.{picked[0][1]}"
    title = f"{s.model.name}, {where}: \"{s.text}\""
    if hide_special:
        title += "  ([CLS] and [SEP] hidden: rows no longer sum to 1)"
    emit(out, head_tables(title, tokens, weights[picked[0][0] - 1], [h for _, h in picked],
                          picked[0][0], decimals, words, s.model.causal), data)


def layer_view(model, sentence, layer, head):
    """The HeadsView of one layer (from --head L.H or --layer L, default 1) and the head picked."""
    from mha_trace.analysis import analyse
    from mha_trace.models import parse_head
    from mha_trace.probes import check_heads
    from mha_trace.run import from_model

    s = encode(model, sentence)
    only = None
    if head is not None:
        picked = parse_head(head)
        check_heads(s.model, [picked])
        if layer is not None and layer != picked[0]:
            raise MhaError(f"--layer {layer} and --head {head} name different layers")
        layer, only = picked
    return s, analyse(from_model(s, _layer(s, layer or 1))), only


def explain(model, sentence, layer, head, token, position, decimals, out: Output):
    from mha_trace.analysis import find_position, walk

    s, view, only = layer_view(model, sentence, layer, head)
    w = walk(view, find_position(s.tokens, token, position))
    emit(out, w.renderables(decimals=decimals, head=only), w.data(decimals, only))


def shapes(model, sentence, layer, out: Output, decode: int = 0):
    from mha_trace.output import make_console
    from mha_trace.run import from_model
    from mha_trace.shapes import trace_run

    if decode:
        from mha_trace.models import load
        from mha_trace.probes import predict
        from mha_trace.run import from_model_decode

        m = load(model)
        if not m.causal:
            raise MhaError(f"decode needs a causal model; {m.name} is an encoder (try --model "
                           f"smollm2)", quantity="decode")
        text = DEFAULT_SENTENCE if sentence is None else sentence
        p = predict(m, text, 1, decode)  # greedy tokens: what real decoding feeds back
        _, ids = m.tokenize(text)
        labels = tuple(m.token_text(i) for i in ids + p.generated)
        report = trace_run(from_model_decode(m, ids + p.generated, len(ids), layer or 1, labels))
        console = make_console(out)
        emit(out, report.renderables(console.width), report.data(), console)
        return
    s = encode(model, sentence)
    report = trace_run(from_model(s, _layer(s, layer or 1)))
    console = make_console(out)
    emit(out, report.renderables(console.width), report.data(), console)


def ablate(model, sentence, head, decimals, out: Output, rank: bool = False, top: int = 20):
    from mha_trace.models import parse_head
    from mha_trace.probes import ablate as run_ablate
    from mha_trace.render.model import ablation_data, ablation_renderables

    if rank:
        from mha_trace.probes import rank_heads
        from mha_trace.render.model import ranking_data, ranking_renderables

        r = rank_heads(encode(model, sentence))
        emit(out, ranking_renderables(r, top), ranking_data(r))
        return
    removed = [parse_head(part.strip()) for part in head.split(",") if part.strip()]
    if not removed:
        raise MhaError("needs at least one LAYER.HEAD, e.g. 6.12", quantity="head")
    a = run_ablate(encode(model, sentence), removed)
    emit(out, ablation_renderables(a, decimals), ablation_data(a, decimals))


@app.command(short_help="Which layer.head of a model does what, ranked.")
@output_options()
def survey(
    model: Annotated[str, typer.Option("--model", help="The pretrained model: minilm. Example: --model minilm", metavar="NAME")] = "minilm",
    sentence: Annotated[str | None, typer.Option("--sentence", "-s", help="Score heads on this text instead of the built-in set of six sentences. Example: --sentence \"The cat sat on the mat.\"")] = None,
    source: Annotated[str | None, typer.Option("--from", help="Coreference probe: the word that refers (with --to). Example: --from it")] = None,
    targets: Annotated[str | None, typer.Option("--to", help="Coreference probe: the candidate words, comma-separated. Example: --to animal,street")] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=20, help="How many heads to list per behaviour. Example: --top 5")] = 3,
    out: Output = None,
):
    """Which layer.head does what: previous token, next token, self, [CLS] and [SEP] sinks,
    punctuation, and (with --from/--to) a coreference probe, each head scored and ranked.

    Example: mha-trace survey --model minilm --from it --to animal,street
    """
    from mha_trace.models import load
    from mha_trace.probes import SURVEY_SENTENCES, survey as run_survey
    from mha_trace.render.survey import survey_data, survey_renderables

    if (source is None) != (targets is None):
        raise MhaError("--from and --to go together, e.g. --from it --to animal,street")
    to = [t.strip().lower() for t in targets.split(",") if t.strip()] if targets else None
    sentences = [sentence] if sentence is not None else list(SURVEY_SENTENCES)
    result = run_survey(load(model), sentences, source.lower() if source else None, to,
                        builtin=sentence is None)
    emit(out, survey_renderables(result, top), survey_data(result, top))


@app.command(short_help="A causal model's next-token distribution.")
@output_options()
def predict(
    model: Annotated[str, typer.Option("--model", help="A causal model: smollm2. Example: --model smollm2", metavar="NAME")] = "smollm2",
    sentence: Annotated[str, typer.Option("--sentence", "-s", help="The text to continue (plain, no chat template). Example: --sentence \"The capital of France is\"")] = "The capital of France is",
    top: Annotated[int, typer.Option("--top", min=1, max=100, help="How many next tokens to list. Example: --top 5")] = 10,
    generate: Annotated[int, typer.Option("--generate", min=0, max=200, help="Also continue greedily for N tokens. Example: --generate 8")] = 0,
    out: Output = None,
):
    """A causal model's next-token distribution: the top tokens with their probabilities.

    Example: mha-trace predict --model smollm2 --sentence "The capital of France is" --generate 5
    """
    from mha_trace.models import load
    from mha_trace.probes import predict as run_predict
    from mha_trace.render.model import prediction_data, prediction_renderables

    p = run_predict(load(model), sentence, top, generate)
    emit(out, prediction_renderables(p), prediction_data(p))
