"""`cost` (arithmetic only: no torch on its path) and `verify` (the module against PyTorch)."""

from typing import Annotated

import typer

from mha_trace.cli.app import _title, app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.output import Format, Output, emit


@app.command()
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
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    debug: DebugOpt = False,
):
    """Parameters, FLOPs per stage, score memory (materialised vs tiled) and KV cache, exactly.

    Example: mha-trace cost --preset gpt3-175b --seq 2048 --dtype float16
    """
    from mha_trace.cost import Dims, cost_rows, load_preset
    from mha_trace.render_cost import cost_data, cost_renderables
    from mha_trace.validate import heads_divide, kv_heads_divide, positive

    p = load_preset(preset) if preset else {}
    pick = lambda flag, key, default: flag if flag is not None else p.get(key, default)
    batch, seq = pick(batch, "batch", 1 if preset else 2), pick(seq, "seq", 10)
    d_model, heads, layers = pick(d_model, "d_model", 512), pick(heads, "heads", 8), pick(layers, "layers", 1)
    kv_heads = pick(kv_heads, "kv_heads", heads)
    for name, value in (("batch", batch), ("seq", seq), ("layers", layers)):
        positive(name, value)
    heads_divide(d_model, heads)
    kv_heads_divide(heads, kv_heads)
    d = Dims(batch, seq, d_model, heads, kv_heads, dtype.value, bias=pick(bias, "bias", True))
    rows = cost_rows(d, layers)
    label = p.get("name", "custom") if preset else "custom"
    emit(Output(format, no_color, width, svg, html, _title()),
         cost_renderables(rows, d, layers, label, p.get("source"), formulas),
         cost_data(rows, d, layers, preset, p.get("source")))


@app.command()
def verify(
    config: Annotated[str | None, typer.Option("--config", "-c", help="Verify on a config's Q, K, V (or generated input) instead of random sizes from flags. Example: --config chicken-road")] = None,
    batch: BatchOpt = 2,
    seq: SeqOpt = 10,
    d_model: DModelOpt = 512,
    heads: HeadsOpt = 8,
    kv_heads: KvHeadsOpt = None,
    device: DeviceOpt = Device.cpu,
    dtype: DtypeOpt = Dtype.float32,
    mask: MaskOpt = Mask.none,
    pad: PadOpt = 0,
    seed: SeedOpt = 0,
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    debug: DebugOpt = False,
):
    """Check the module against numpy by hand, nn.MultiheadAttention and F.scaled_dot_product_attention.

    Exits 1 when any difference exceeds the dtype's tolerance.
    Example: mha-trace verify --heads 8 --kv-heads 2 --mask causal --dtype float64
    """
    from mha_trace.render_cost import verify_data, verify_renderables
    from mha_trace.verify import verify_config, verify_flags

    if config is not None:
        from mha_trace.config import load

        report = verify_config(load(config), dtype.value, device.value)
    else:
        report = verify_flags(batch, seq, d_model, heads, kv_heads, mask.value, pad, dtype.value,
                              seed, device.value)
    emit(Output(format, no_color, width, svg, html, _title()), verify_renderables(report), verify_data(report))
    if not report.passed:
        raise typer.Exit(1)


