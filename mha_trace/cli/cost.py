"""`cost`: parameters, FLOPs, memory and KV cache, by arithmetic alone (no torch on its path)."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.io.output import Output, emit


@app.command(short_help="Parameters, FLOPs, score memory and KV cache, exactly.")
@output_options()
def cost(
    preset: Annotated[str | None, typer.Option("--preset", help="Published model dimensions: gpt2-small, bert-base, gpt3-175b, llama2-7b, llama2-70b, mistral-7b; flags override them. Example: --preset gpt3-175b")] = None,
    batch: Annotated[int | None, typer.Option("--batch", "-b", help="Batch size B (default 1 with a preset, else 2). Example: --batch 8")] = None,
    seq: Annotated[int | None, typer.Option("--seq", "-t", help="Sequence length T (default: the preset's context, else 10). Example: --seq 4096")] = None,
    d_model: Annotated[int | None, typer.Option("--d-model", "-d", help="Model width (default 512). Example: --d-model 8192")] = None,
    heads: Annotated[int | None, typer.Option("--heads", "-H", help="Query heads (default 8). Example: --heads 64")] = None,
    kv_heads: KvHeadsOpt = None,
    layers: Annotated[int | None, typer.Option("--layers", "-L", help="Number of layers (default 1). Example: --layers 80")] = None,
    dtype: DtypeOpt = Dtype.float32,
    bias: Annotated[bool | None, typer.Option("--bias/--no-bias", help="Projection biases (default: the preset's, else yes). Example: --no-bias")] = None,
    formulas: Annotated[bool, typer.Option("--formulas", help="Show each formula with the numbers put in. Example: --formulas")] = False,
    window: Annotated[int | None, typer.Option("--window", help="Sliding-window attention: the KV cache keeps at most W tokens per layer (default: the preset's). Example: --window 4096")] = None,
    rope: Annotated[bool | None, typer.Option("--rope/--no-rope", help="Rotary positions (default: the preset's); they add no parameters. Example: --rope")] = None,
    out: Output = None,
):
    """Parameters, FLOPs per stage, score memory (materialised vs tiled) and KV cache, exactly.

    Example: mha-trace cost --preset gpt3-175b --seq 2048 --dtype float16
    """
    from mha_trace.core.costs import cost_report

    report = cost_report(preset, batch, seq, d_model, heads, kv_heads, layers, dtype.value, bias,
                         window, rope, formulas)
    emit(out, report.renderables, report.data)
