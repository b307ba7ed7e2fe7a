"""`heads`, `explain`, `compare` and `ablate`: what each head computes, on any source of a run."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.errors import MhaError
from mha_trace.io.output import Output, emit, make_console


def _cross_heads_png(o: dict) -> str | None:
    """heads draws Whisper's cross-attention and encoder heads in text and JSON; their slide is
    survey's (--attention self has the text models' slides)."""
    if o["audio"] is not None and getattr(o["attention"], "value", o["attention"]) != "self":
        return ("with --audio, heads draws in text and JSON; the slide of the cross-attention "
                "is survey --model whisper --audio FILE --png")
    return None


@app.command(short_help="Each head's attention weights, their average, the output.")
@output_options(png=_cross_heads_png, step=True)
@run_options("config", "scoring", "latent", "resplit", "module", "module_width", "model", "layer", "device", "audio")
def heads(
    head: HeadOpt = None,
    decimals: DecimalsOpt = 4,
    overview: Annotated[bool, typer.Option("--overview", help="With --model: every layer.head as a small map, on one screen (the default when neither --layer nor --head is given). Example: --overview")] = False,
    words: Annotated[bool, typer.Option("--words", help="With --model: group word pieces into words (to a word: the sum over its pieces; from a word: the mean). Example: --words")] = False,
    hide_special: Annotated[bool, typer.Option("--hide-special", help="With --model: leave out the [CLS] and [SEP] rows and columns. Example: --hide-special")] = False,
    include_inputs: IncludeInputsOpt = False,
    concat: Annotated[bool, typer.Option("--concat", help="With --head N: also the concatenation of every head and the output after W_O (shown without --head). Example: --head 2 --concat")] = False,
    effect: EffectOpt = False,
    o=None,
    out: Output = None,
):
    """Each head's attention weights (rows: queries, columns: keys), their average, the output.

    With --model, a pretrained model's real heads: every head at a glance, one layer, or one.
    Example: mha-trace heads --config chicken-road --head 3
    Example: mha-trace heads --model minilm --sentence "The animal didn't cross the street because it was too tired." --head 4.1
    Example: mha-trace heads --model whisper --audio examples/audio/animal.wav --head 4.3
    Example: mha-trace heads --model whisper --audio examples/audio/cat.wav --attention self
    """
    from mha_trace.views.heads import HeadsRequest, heads_view

    view = heads_view(HeadsRequest(o, head, overview, words, hide_special, effect, concat,
                                   json_inputs(include_inputs, out)))
    if o.audio is not None and o.attention != "self":
        return emit(out, lambda: view.renderables(make_console(out).width), view.data)
    if o.model:
        return _emit_whole_model(view, out, decimals)
    emit(out, lambda: view.renderables(decimals=decimals, head=view.only, concat=concat),
         lambda: view.data(decimals=decimals, head=view.only), page=view, slide=view,
         decimals=decimals)


@app.command(short_help="One token through every head, every product written out.")
@output_options(png=True, step=True)
@run_options("config", "scoring", "latent", "resplit", "module", "module_width", "model", "layer", "device", "audio")
def explain(
    token: Annotated[str | None, typer.Option("--token", help="The query token to follow (default: the first). Example: --token cat")] = None,
    position: Annotated[int | None, typer.Option("--position", "-p", help="Pick the token by position (0-based), needed when it repeats. Example: --position 4")] = None,
    head: HeadOpt = None,
    decimals: DecimalsOpt = 4,
    include_inputs: IncludeInputsOpt = False,
    effect: EffectOpt = False,
    why: Annotated[bool, typer.Option("--why", help="Split each key's score by where q and k come from: a config's d_k products; a model's token and position embeddings, each earlier layer's attention and MLP output, and biases (norms frozen, so the parts add up); the weights again without each source. Example: --why --head 2")] = False,
    by_head: Annotated[bool, typer.Option("--by-head", help="With --why on a model: each earlier layer's heads as sources of their own. Example: --why --by-head")] = False,
    impl: Annotated[Impl, typer.Option("--impl", help="explicit (the softmax of the whole row, as the chapter writes it) or tiled (the row through FlashAttention-2's loop: keys in tiles, a running max, rescale and sum). Example: --impl tiled --token cat")] = Impl.explicit,
    block_k: Annotated[int | None, typer.Option("--block-k", help="With --impl tiled: keys per tile (default: half of them, two tiles). Example: --impl tiled --block-k 2")] = None,
    rope_planes: Annotated[bool, typer.Option("--rope-planes", help="Split each key's score by RoPE's rotation planes (dims i and i + d_k/2), each with its frequency: a config with --rope, or a model with RoPE (smollm2, one head). Example: --rope --config chicken-road --token it --rope-planes")] = False,
    o=None,
    out: Output = None,
):
    """One token through every head: q·k written out for each key, ÷√d_k, softmax, Σ w·v, concat, W_O.

    With --model, through a real layer's heads (--head L.H for one, --layer L for all; layer 1 by default).
    Example: mha-trace explain --token cat
    Example: mha-trace explain --model minilm --token it --head 6.12
    Example: mha-trace explain --model minilm --token it --head 3.1 --why
    Example: mha-trace explain --token cat --impl tiled --block-k 2
    Example: mha-trace explain --model whisper --audio examples/audio/animal.wav --token street
    Example: mha-trace explain --model whisper --audio examples/audio/animal.wav --token street --head 4.3 --why
    Example: mha-trace explain --model whisper --audio examples/audio/cat.wav --attention self --token mat --head 2.3 --why
    """
    from mha_trace.views.explain import ExplainRequest, explain_view

    w = explain_view(ExplainRequest(o, token, position, head, effect, why, by_head, impl.value,
                                    block_k, rope_planes, json_inputs(include_inputs, out)))
    if o.audio is not None and o.attention != "self":
        return emit(out, lambda: w.renderables(make_console(out).width), w.data)
    shown = getattr(w, "only", None)
    emit(out, lambda: w.renderables(decimals=decimals, head=shown),
         lambda: w.data(decimals=decimals, head=shown),
         page=None if rope_planes or o.module else w, slide=None if o.module else w, head=shown)


def _emit_whole_model(view, out: Output, decimals: int) -> None:
    """heads --model: the pictures first (a refusal before any text), then the text, or a line
    on stderr when the view is too long for the terminal and a picture or a page shows it."""
    import sys

    from mha_trace.io.output import Format, make_console, pictures, shown_elsewhere

    written = pictures(out, page=view, slide=view, decimals=decimals)
    shown = None
    if out.format != Format.json:
        try:
            shown = view.renderables(make_console(out).width, decimals=decimals)
        except MhaError as too_long:
            shows = shown_elsewhere(out)
            if shows is None:
                raise
            what = too_long.message.split(":")[0]
            print(f"No text view: {what[0].lower()}{what[1:]} ({shows} them all)", file=sys.stderr)
    if shown is not None or out.format == Format.json:
        emit(written, lambda: shown, lambda: view.data(decimals=decimals))


@app.command(short_help="The same input split into different head counts.")
@output_options(png=True)
@run_options("config", "device")
def compare(
    heads: Annotated[str, typer.Option("--heads", "-H", help="Comma-separated head counts, each dividing d_model. Example: --heads 1,2,4")] = "1,2,4",
    decimals: DecimalsOpt = 4,
    module: ModuleOpt = None,
    o=None,
    out: Output = None,
):
    """The same input split into different head counts, side by side, with a one-line reading.

    Example: mha-trace compare --heads 1,2,4
    """
    from dataclasses import replace

    from mha_trace.views.compare import CompareRequest, compare_view

    shown = compare_view(CompareRequest(replace(o, module=module), heads))
    emit(out, lambda: shown.renderables(decimals=decimals), lambda: shown.data(decimals=decimals),
         slide=shown, decimals=decimals)


@app.command(short_help="The output without some heads, and how far it moved.")
@output_options(png=lambda o: None if o["prune"] else (
    "--png draws the pruning curve: it goes with --model smollm2 --prune"), scale=False)
@run_options("config", "resplit", "model", "device", "time")
def ablate(
    head: Annotated[str | None, typer.Option("--head", help="Head(s) to remove, 1-based, comma-separated (default 2); with --model, LAYER.HEAD. Example: --head 1,3, or --head 6.12,3.1")] = None,
    decimals: DecimalsOpt = 4,
    module: ModuleOpt = None,
    rank: Annotated[bool, typer.Option("--rank", help="With --model: remove every head on its own and rank them by their effect (one batched pass). Example: --rank")] = False,
    top: Annotated[int, typer.Option("--top", min=1, max=10000, help="With --rank: how many heads to list. Example: --top 10")] = 20,
    prune: Annotated[bool, typer.Option("--prune", help="With a causal --model: rank every head by Michel et al.'s importance on the bundled corpus, remove them least important first, and measure the next-token loss at each step (about 45 seconds on 2 cores; --png draws the curve). Example: --model smollm2 --prune")] = False,
    o=None,
    out: Output = None,
):
    """The output with some heads removed (zeroed before W_O), and how far each token moved.

    With --model, through the whole model: how far each token's final vector moves.
    Example: mha-trace ablate --head 2
    Example: mha-trace ablate --model minilm --head 6.12,3.1
    Example: mha-trace ablate --model smollm2 --prune --png pruning.png
    """
    from dataclasses import replace

    from mha_trace.io.output import progress
    from mha_trace.views.ablate import AblateRequest, ablate_view

    a = ablate_view(AblateRequest(replace(o, module=module), head, rank, prune), progress)
    if prune:
        return emit(out, a.renderables, a.data, slide=a)
    if rank:
        return emit(out, lambda: a.renderables(top=top), a.data)
    emit(out, lambda: a.renderables(decimals=decimals), lambda: a.data(decimals=decimals))
