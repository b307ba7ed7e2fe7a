"""`heads`, `explain`, `compare` and `ablate`: what each head computes, on any source of a run."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.core.picks import check_picks, head_number
from mha_trace.runs.model_options import check_picks_early
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
@run_options("config", "resplit", "module", "module_width", "model", "layer", "device", "audio")
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
    from mha_trace.runs.model_options import needs_model
    from mha_trace.runs.resolve import check_early, resolve

    config = check_early(o)  # before torch: a wrong flag is refused at once
    check_include(include_inputs, o.model, out)
    if o.model:
        check_picks_early(o.model, o.layer, head)
    if o.audio is not None and o.attention != "self":
        return _cross_head(o, head, out, (overview and head is not None) or words or hide_special
                           or include_inputs or concat or effect or o.layer)
    if o.model:
        from mha_trace.analyses.model_heads import check_not_overview, model_heads

        view = model_heads(resolve(o), o.layer, head, words, hide_special, effect)
        check_not_overview(view, overview)
        return _emit_whole_model(view, out, decimals)
    needs_model(None, None, overview=overview, words=words, hide_special=hide_special)
    head = head_number(head)
    if concat and head is None:
        raise MhaError("--concat goes with --head N (without --head every head, the "
                       "concatenation and the output are shown)", quantity="concat")
    check_picks(config, [head])
    from mha_trace.analyses.analysis import run_heads

    run = resolve(o)
    view = run_heads(run, head, effect)
    emit(out, lambda: view.renderables(decimals=decimals, head=head, concat=concat),
         lambda: with_inputs(view.data(decimals=decimals, head=head), run, include_inputs),
         page=view, slide=view, decimals=decimals)


@app.command(short_help="One token through every head, every product written out.")
@output_options(png=True, step=True)
@run_options("config", "resplit", "module", "module_width", "model", "layer", "device", "audio")
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
    from mha_trace.runs.resolve import check_early, resolve
    from mha_trace.views.explain import check_shown_as

    config = check_early(o)  # before torch: a wrong flag is refused at once
    check_shown_as(impl.value, block_k, why, effect, o.module, rope_planes, by_head)
    if o.model:
        check_picks_early(o.model, o.layer, head)
    if o.audio is not None and o.attention != "self":
        return _listen(o, token, position, effect, (why, head), out, by_head or include_inputs
                       or impl.value != "explicit" or rope_planes or o.layer or (head and not why))
    if o.model:
        from mha_trace.runs.model_options import refuse_with_model

        refuse_with_model(include_inputs=include_inputs or None)
        run, w, head = _model_walk(o, head, token, position, effect)
    else:
        check_include(include_inputs, None, out)
        head = head_number(head)
        if by_head:  # what --by-head splits is a model's earlier layers
            raise MhaError("--by-head splits a model's earlier layers into their heads; a "
                           f"{'module' if o.module else 'config'}'s scores split into the head's "
                           "dims", quantity="by_head")
        check_picks(config, [head], token, position)
        from mha_trace.analyses.analysis import run_heads
        from mha_trace.analyses.walk import walk
        from mha_trace.core.picks import find_position

        run = resolve(o)
        view = run_heads(run, head, effect)
        if o.module:
            return _module_explain(run, view, token, position, head, why, decimals, out,
                                   include_inputs)
        w = walk(view, find_position(view.tokens, token, position))
    if impl.value == "tiled" or rope_planes:
        from mha_trace.analyses.rope_planes import rope_planes as split
        from mha_trace.analyses.tiled_walk import tiled_walk

        t = tiled_walk(w, block_k) if impl.value == "tiled" else split(w, head)
        return emit(out, lambda: t.renderables(decimals=decimals, head=head),
                    lambda: with_inputs(t.data(decimals=decimals, head=head), run, include_inputs),
                    page=t if impl.value == "tiled" else None, slide=t, head=head)
    if why:
        from mha_trace.analyses.why import with_why

        w = with_why(w, run, head, by_head)
    emit(out, lambda: w.renderables(decimals=decimals, head=head),
         lambda: with_inputs(w.data(decimals=decimals, head=head), run, include_inputs), page=w,
         slide=w, head=head)


def _model_walk(o, head: str | None, token, position, effect: bool):
    """explain --model: (the run of the layer --head L.H or --layer names, the walk, the head)."""
    from dataclasses import replace

    from mha_trace.analyses.model_heads import head_in_layer, model_walk
    from mha_trace.runs.resolve import resolve

    layer, only = head_in_layer(o.layer, head)
    run = resolve(replace(o, layer=layer))
    return run, model_walk(run, only, token, position, effect), only


def _module_explain(run, view, token, position, head, why: bool, decimals: int, out: Output,
                    include_inputs: bool) -> None:
    """explain --module: what the user's module returned, one query's row per head."""
    from mha_trace.core.picks import find_position
    from mha_trace.render.explain import module_explain_data, module_explain_renderables

    i = find_position(view.tokens, token, position)
    found = None
    if why:
        from mha_trace.analyses.why import module_why

        found = module_why(run, view, i, [head] if head else range(1, view.heads + 1))
    emit(out, lambda: module_explain_renderables(view, i, decimals, head, found),
         lambda: with_inputs(module_explain_data(view, i, decimals, head, found), run,
                             include_inputs))


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


def _int_list(text: str, quantity: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",")] if text.strip() else []
    except ValueError:
        raise MhaError(f"expected comma-separated integers like 1,2,4, got '{text}'",
                       quantity=quantity) from None
    if not values:
        raise MhaError("needs at least one number, e.g. 1,2,4", quantity=quantity)
    return values


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
    if module:
        raise MhaError("compare re-splits one set of projections into other head counts, which "
                       "only the lecture's module exposes; for your class, run heads --module "
                       "once per head count (--heads 1, 2, 4)", quantity="module")
    from mha_trace.runs.resolve import resolve_splits

    runs = resolve_splits(o, _int_list(heads, "heads"))  # the checks before torch, then the runs
    from mha_trace.analyses.analysis import Comparison, analyse_splits

    shown = Comparison(analyse_splits(runs))
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
    from mha_trace.runs.resolve import check_early, resolve

    config = check_early(o)  # before torch: a wrong flag is refused at once
    if module:
        raise MhaError("ablate zeroes a head's slice of the concatenation inside the lecture's "
                       "module, and a foreign class's concatenation cannot be reached from outside; "
                       "verify --module checks your class against that module instead",
                       quantity="module")
    from mha_trace.runs.model_options import needs_model

    if o.model:
        from mha_trace.cli import models

        if sum((head is not None, rank, prune)) > 1:
            raise MhaError("choose one of --head, --rank and --prune")
        if prune:
            return models.prune(o, out)
        if head is None and not rank:
            raise MhaError("with --model, name the heads to remove, e.g. --head 6.12 (or rank "
                           "them all with --rank, or prune them with --prune)", quantity="head")
        check_picks_early(o.model, o.layer, head)
        return _ablate_model(o, head, decimals, out, rank, top)
    needs_model(o.sentence, None, rank=rank, prune=prune)
    removed = _int_list("2" if head is None else head, "head")
    check_picks(config, removed)
    from mha_trace.analyses.analysis import ablate_heads as run_ablate

    a = run_ablate(resolve(o, "config"), removed)
    emit(out, lambda: a.renderables(decimals=decimals), lambda: a.data(decimals=decimals))


def _ablate_model(o, head: str | None, decimals: int, out: Output, rank: bool, top: int) -> None:
    """ablate --model: the heads named (L.H, comma-separated) removed, or every head ranked."""
    from mha_trace.analyses.model_analysis import ablate_model_heads, rank_heads
    from mha_trace.models.guards import parse_head
    from mha_trace.runs.resolve import resolve

    run = resolve(o)
    if rank:
        from mha_trace.io.output import progress

        with progress(run.sentence.model.layers, "ranking heads (one batch per layer)") as advance:
            r = rank_heads(run.sentence, advance)
        emit(out, lambda: r.renderables(top=top), r.data)
        return
    removed = [parse_head(part.strip()) for part in head.split(",") if part.strip()]
    if not removed:
        raise MhaError("needs at least one LAYER.HEAD, e.g. 6.12", quantity="head")
    a = ablate_model_heads(run.sentence, removed)
    emit(out, lambda: a.renderables(decimals=decimals), lambda: a.data(decimals=decimals))


def _listen(o, token, position, effect, why, out, other) -> None:
    """explain --model whisper --audio FILE --token WORD: one token's query in every cross-attention
    head; with --why and --head L.H, that head's scores split by where q and k come from."""
    from mha_trace.analyses.alignment import listen
    from mha_trace.runs.resolve import load

    why, head = why
    if other or (why and (head is None or effect)):
        raise MhaError("with --audio, explain follows one token through every cross-attention head: "
                       "--token or --position, and --effect, or --why with --head L.H (--attention "
                       "self: every option, on the decoder's self-attention)", quantity="audio")
    model = load(o)
    if why:
        from mha_trace.analyses.frame_why import cross_why, encoder_why
        from mha_trace.runs.model_options import check_heads
        from mha_trace.models.guards import parse_head

        chosen = parse_head(head)
        check_heads(model, [chosen])
        explained = encoder_why if o.attention == "encoder" else cross_why
        result = explained(model, o.audio, token, position, chosen)
    elif o.attention == "encoder":
        from mha_trace.analyses.encoder import listen_frame

        result = listen_frame(model, o.audio, token, position, effect)
    else:
        result = listen(model, o.audio, token, position, effect)
    emit(out, lambda: result.renderables(make_console(out).width), result.data)


def _cross_head(o, head, out, other) -> None:
    """heads --model whisper --audio FILE [--head L.H]: every cross-attention head, or one, tokens × time."""
    from mha_trace.analyses.alignment import cross_heads
    from mha_trace.runs.model_options import check_heads
    from mha_trace.models.guards import parse_head
    from mha_trace.runs.resolve import load

    if other:
        raise MhaError("with --audio, heads shows the cross-attention heads: every one, or --head L.H "
                       "alone (e.g. --head 4.3; survey --model whisper --audio FILE ranks them all; "
                       "--attention self: every view of the decoder's self-attention)", quantity="head")
    model = load(o)
    chosen = None if head is None else parse_head(head)
    if chosen is not None:
        check_heads(model, [chosen])
    if o.attention == "encoder":
        from mha_trace.analyses.encoder import encoder_heads

        result = encoder_heads(model, o.audio, chosen)
    else:
        result = cross_heads(model, o.audio, chosen)
    emit(out, lambda: result.renderables(make_console(out).width), result.data)
