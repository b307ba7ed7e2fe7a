"""`shapes`: a real forward pass of the module (or the user's own), traced op by op."""


import typer

from mha_trace.cli.app import _title, app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.output import Format, Output, emit, make_console


@app.command()
def shapes(
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
    module: ModuleOpt = None,
    init: InitOpt = None,
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    debug: DebugOpt = False,
):
    """Trace a real forward pass and print the shape, stride and memory of every tensor op.

    Example: mha-trace shapes --d-model 512 --heads 8 --seq 6 --mask causal
    """
    from mha_trace.render_shapes import (failure_renderables, shapes_data, shapes_notes,
                                         shapes_table)
    from mha_trace.shapes import ShapesRequest, run_shapes

    report = run_shapes(ShapesRequest(batch, seq, d_model, heads, kv_heads, device.value,
                                      dtype.value, mask.value, pad, seed, module, init))
    out = Output(format, no_color, width, svg, html, _title())
    console = make_console(out)
    table = shapes_table(report, console.width)
    if report.failure:
        emit(out, [table, *failure_renderables(report)], shapes_data(report), console)
        raise typer.Exit(1)
    emit(out, [table, shapes_notes(report)], shapes_data(report), console)
