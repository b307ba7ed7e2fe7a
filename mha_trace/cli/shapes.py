"""`shapes`: a real forward pass of the module (or the user's own), traced op by op."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.errors import MhaError
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.io.output import Output, emit, make_console


@app.command(short_help="Every tensor op of a real forward pass: shape, stride, memory.")
@output_options(step=True)
@run_options("sizes", "scoring", "latent", "config_name", "module", "model", "layer", "audio")
def shapes(
    compare_impl: Annotated[bool, typer.Option("--compare-impl", help="With --impl sdpa or tiled: also run the explicit path and compare what each allocates, which tensors the other path never makes, and how far the outputs differ. Example: --impl tiled --compare-impl")] = False,
    block_q: Annotated[int | None, typer.Option("--block-q", help="With --impl tiled: rows of a query tile (default: half the sequence, 2 × 2 tiles). Example: --impl tiled --block-q 4")] = None,
    block_k: Annotated[int | None, typer.Option("--block-k", help="With --impl tiled: rows of a key/value tile (default: half the keys). Example: --impl tiled --block-k 4")] = None,
    compact: Annotated[bool, typer.Option("--compact", help="For slides: the lecture table's eight rows (input, W_q, view, transpose, attention, transpose back, contiguous + view, W_o), each shape also in symbols. Example: --compact")] = False,
    decode: Annotated[int, typer.Option("--decode", help="After a prefill over --seq tokens, decode N more one at a time with a growing KV cache (implies a causal mask). Example: --decode 3")] = 0,
    include_inputs: IncludeInputsOpt = False,
    o=None,
    out: Output = None,
):
    """Trace a real forward pass and print the shape, stride and memory of every tensor op.

    With --model, one real layer's attention on the sentence's hidden states.
    Example: mha-trace shapes --d-model 512 --heads 8 --seq 6 --mask causal
    Example: mha-trace shapes --model minilm --sentence "The cat sat on the mat." --layer 1
    Example: mha-trace shapes --decode 3 --mask causal --kv-heads 2
    Example: mha-trace shapes --model whisper --audio examples/audio/cat.wav --layer 4
    Example: mha-trace shapes --impl tiled --mask causal --compare-impl
    Example: mha-trace shapes --config cat-sat-on-mat --module examples/chapter_numpy_mha.py:MultiHeadAttention
    """
    from dataclasses import replace

    from mha_trace.views.shapes import ShapesRequest, shapes_view

    o = replace(o, block_q=block_q, block_k=block_k, decode=decode)
    report = shapes_view(ShapesRequest(o, compact, compare_impl, json_inputs(include_inputs, out)))
    console = make_console(out)
    if report.failure:  # the trace up to the failing line is printed; no picture of a failed run
        out = replace(out, svg=None, html=None)
    emit(out, lambda: report.renderables(console.width), report.data, console, page=report)
    if report.failure:
        from mha_trace.io.output import display_path

        f = report.failure
        where = f"{display_path(f.file)}:{f.line}" if f.line else display_path(f.file)
        raise MhaError(f"forward raised at {where}: {f.message}", exit_code=1)
