"""The command line: parse options, call the library, render, exit. Nothing else lives here.

torch is imported inside the commands that need it, so `--help` answers instantly.
"""

import os
import sys
from enum import Enum
from typing import Annotated

import typer
from typer.core import TyperGroup

from mha_trace import __version__
from mha_trace.errors import MhaError
from mha_trace.output import Format, Output, emit, make_console

_debug = False
_argv: list[str] = []


class _Group(TyperGroup):
    """Every failure the user can fix becomes one `Error: ...` line with exit code 2 (or 1)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        global _debug, _argv
        argv = list(sys.argv[1:] if args is None else args)
        _debug, _argv = "--debug" in argv, argv
        try:
            rv = super().main(args=argv, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except MhaError as e:
            if _debug:
                raise
            _fail(e.message, e.exit_code)
        except typer.Abort:
            _fail("aborted", 130)
        except typer.TyperException as e:  # click's usage errors, as typer raises them
            if _debug:
                raise
            if type(e).__name__ == "NoArgsIsHelpError":
                print(e.format_message())
                sys.exit(0)
            ctx = getattr(e, "ctx", None)
            cmd = f" {ctx.info_name}" if ctx is not None and ctx.parent is not None else ""
            _fail(f"{e.format_message()} (see: mha-trace{cmd} --help)", getattr(e, "exit_code", 2))
        except KeyboardInterrupt:
            _fail("interrupted", 130)
        if not standalone_mode:
            return rv
        sys.exit(rv if isinstance(rv, int) else 0)


def _title() -> str:
    """The command line as typed, for the title of --svg pictures."""
    words, skip = ["mha-trace"], False
    for arg in _argv:
        if skip or arg.split("=")[0] in ("--svg", "--html", "--png"):
            skip = not skip and "=" not in arg
            continue
        words.append(arg)
    return " ".join(words)


def _fail(message: str, code: int):
    sys.stderr.write(f"Error: {message}\n")
    sys.exit(code)


app = typer.Typer(
    cls=_Group,
    help="See multi-head attention: every tensor shape of a real forward pass, every head's "
         "weights, one token's dot products.\n\nExample: mha-trace shapes --d-model 512 --heads 8",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool):
    if value:
        print(f"mha-trace {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit. Example: mha-trace --version")] = False,
):
    """mha-trace: see multi-head attention, one tensor operation at a time."""


class Device(str, Enum):
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"
    meta = "meta"


class Dtype(str, Enum):
    float32 = "float32"
    float64 = "float64"
    float16 = "float16"
    bfloat16 = "bfloat16"


class Mask(str, Enum):
    none = "none"
    causal = "causal"


# options shared by every command
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="table (rich, plain when piped), json or markdown. Example: --format json")]
NoColorOpt = Annotated[bool, typer.Option("--no-color", help="Plain text without colour or escape codes (NO_COLOR does the same). Example: --no-color")]
WidthOpt = Annotated[int | None, typer.Option("--width", min=40, help="Render at this many columns (default: the terminal's, 100 when piped). Example: --width 120")]
ModuleOpt = Annotated[str | None, typer.Option("--module", "-m", help="Trace your own class instead: FILE.py:Class or package.module:Class (this runs your code). Example: --module examples/l04_mha.py:MultiHeadAttention", metavar="SPEC")]
InitOpt = Annotated[str | None, typer.Option("--init", help="Constructor arguments for --module, as name=value pairs. Example: --init 'd_model=64, num_heads=4'")]
SvgOpt = Annotated[str | None, typer.Option("--svg", help="Also save what was printed as an SVG picture (for slides). Example: --svg shapes.svg", metavar="FILE")]
HtmlOpt = Annotated[str | None, typer.Option("--html", help="Also save what was printed as HTML. Example: --html shapes.html", metavar="FILE")]
PngOpt = Annotated[str | None, typer.Option("--png", help='Save per-head heatmaps as PNG (needs: pip install "mha-trace[plot]"). Example: --png heads.png', metavar="FILE")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show Python tracebacks instead of one-line errors. Example: --debug")]

# sizes
BatchOpt = Annotated[int, typer.Option("--batch", "-b", help="Batch size B. Example: --batch 2")]
SeqOpt = Annotated[int, typer.Option("--seq", "-t", help="Sequence length T (tokens). Example: --seq 10")]
DModelOpt = Annotated[int, typer.Option("--d-model", "-d", help="Model width d_model; must be divisible by --heads. Example: --d-model 512")]
HeadsOpt = Annotated[int, typer.Option("--heads", "-H", help="Number of query heads H; d_k = d_model / H. Example: --heads 8")]
KvHeadsOpt = Annotated[int | None, typer.Option("--kv-heads", help="Key/value heads (grouped-query attention; 1 is multi-query); must divide --heads. Example: --kv-heads 2")]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Where to run; meta computes shapes without allocating memory. Example: --device meta")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Tensor dtype. Example: --dtype bfloat16")]
MaskOpt = Annotated[Mask, typer.Option("--mask", help="none, or causal (no query looks at later keys). Example: --mask causal")]
PadOpt = Annotated[int, typer.Option("--pad", help="Mask the last N key positions as padding. Example: --pad 2")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed for weights and inputs. Example: --seed 0")]


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


ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="A TOML config file, or the name of a bundled one (see mha-trace configs); default: the chapter's 'The cat sat on mat'. Example: --config chicken-road")]
HeadOpt = Annotated[int | None, typer.Option("--head", help="Show only head N (1-based, as the chapter numbers them). Example: --head 2")]
ResplitOpt = Annotated[int | None, typer.Option("--heads", "-H", help="Re-split the same Q, K, V into H heads (must divide d_model). Example: --heads 4")]
ConfigMaskOpt = Annotated[Mask | None, typer.Option("--mask", help="Override the config's mask: none or causal. Example: --mask causal")]
ConfigPadOpt = Annotated[int | None, typer.Option("--pad", help="Mask the last N tokens as padding keys. Example: --pad 1")]
DecimalsOpt = Annotated[int, typer.Option("--decimals", min=0, max=12, help="Decimals shown (and kept in JSON). Example: --decimals 6")]


def _view(config, heads, kv_heads, mask, pad):
    from mha_trace.analysis import analyse
    from mha_trace.config import load

    c = load(config).with_overrides(heads, kv_heads, mask.value if mask else None, pad)
    return analyse(c)


def _check_head(head, view):
    if head is not None and not 1 <= head <= view.heads:
        raise MhaError(f"--head {head} is out of range (this config has heads 1 to {view.heads})")


@app.command()
def heads(
    config: ConfigOpt = None,
    head: HeadOpt = None,
    heads: ResplitOpt = None,
    kv_heads: KvHeadsOpt = None,
    mask: ConfigMaskOpt = None,
    pad: ConfigPadOpt = None,
    decimals: DecimalsOpt = 4,
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    png: PngOpt = None,
    module: ModuleOpt = None,
    init: InitOpt = None,
    d_model: Annotated[int | None, typer.Option("--d-model", "-d", help="With --module: the width to build it with (default 64). Example: --d-model 64")] = None,
    debug: DebugOpt = False,
):
    """Each head's attention weights (rows: queries, columns: keys), their average, the output.

    Example: mha-trace heads --config chicken-road --head 3
    """
    from mha_trace.render_heads import heads_data, heads_renderables

    if module:
        return _module_heads(module, init, config, d_model, heads, mask, pad, head, decimals,
                             Output(format, no_color, width, svg, html, _title()))
    if d_model is not None:
        raise MhaError("--d-model goes with --module (a config's width is fixed by the config)")
    view = _view(config, heads, kv_heads, mask, pad)
    _check_head(head, view)
    if png:
        from mha_trace.plots import save_heatmaps

        picked = [head - 1] if head else range(view.heads)
        save_heatmaps(png, view.config.title, [(f"head {h + 1}", view.tokens, view.tokens,
                                                view.weights[h], view.mask) for h in picked], decimals)
    emit(Output(format, no_color, width, svg, html, _title()), heads_renderables(view, decimals, head),
         heads_data(view, decimals, head))


def _module_heads(module, init, config, d_model, heads, mask, pad, head, decimals, out):
    from mha_trace.analysis import module_heads
    from mha_trace.config import load
    from mha_trace.render_heads import module_heads_data, module_heads_renderables
    from mha_trace.validate import heads_divide

    d_model, heads = d_model or 64, heads or 4
    if init is None:
        heads_divide(d_model, heads)
    c = load(config).with_overrides(mask=mask.value if mask else None, pad=pad)
    m = module_heads(module, init, c, d_model, heads)
    if head is not None and not 1 <= head <= len(m.weights):
        raise MhaError(f"--head {head} is out of range (the module returned {len(m.weights)} "
                       f"weight map{'s' if len(m.weights) > 1 else ''})")
    emit(out, module_heads_renderables(m, decimals, head), module_heads_data(m, decimals, head))


@app.command()
def explain(
    token: Annotated[str | None, typer.Option("--token", "-t", help="The query token to follow (default: the first). Example: --token cat")] = None,
    position: Annotated[int | None, typer.Option("--position", "-p", help="Pick the token by position (0-based), needed when it repeats. Example: --position 4")] = None,
    config: ConfigOpt = None,
    head: HeadOpt = None,
    heads: ResplitOpt = None,
    kv_heads: KvHeadsOpt = None,
    mask: ConfigMaskOpt = None,
    pad: ConfigPadOpt = None,
    decimals: DecimalsOpt = 4,
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    png: PngOpt = None,
    debug: DebugOpt = False,
):
    """One token through every head: q·k written out for each key, ÷√d_k, softmax, Σ w·v, concat, W_O.

    Example: mha-trace explain --token cat
    """
    from mha_trace.analysis import find_position, walk
    from mha_trace.render_heads import explain_data, explain_renderables

    view = _view(config, heads, kv_heads, mask, pad)
    _check_head(head, view)
    w = walk(view, find_position(view.tokens, token, position))
    if png:
        import numpy as np

        from mha_trace.plots import save_heatmaps

        rows = np.array([[t.weight for t in hw.terms] for hw in w.heads])
        keep = None if view.mask is None else np.repeat(view.mask[w.position][None], len(rows), 0)
        save_heatmaps(png, f"{view.config.title}: the query '{w.token}'",
                      [("weights per head", [f"head {hw.head}" for hw in w.heads], view.tokens,
                        rows, keep)], decimals)
    emit(Output(format, no_color, width, svg, html, _title()), explain_renderables(w, decimals, head),
         explain_data(w, decimals, head))


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise MhaError(f"{option} expects comma-separated integers like 1,2,4, got '{text}'") from None
    if not values:
        raise MhaError(f"{option} needs at least one number, e.g. {option} 1,2,4")
    return values


@app.command()
def compare(
    heads: Annotated[str, typer.Option("--heads", "-H", help="Comma-separated head counts, each dividing d_model. Example: --heads 1,2,4")] = "1,2,4",
    config: ConfigOpt = None,
    mask: ConfigMaskOpt = None,
    pad: ConfigPadOpt = None,
    decimals: DecimalsOpt = 4,
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    png: PngOpt = None,
    debug: DebugOpt = False,
):
    """The same input split into different head counts, side by side, with a one-line reading.

    Example: mha-trace compare --heads 1,2,4
    """
    from mha_trace.analysis import compare as run_compare
    from mha_trace.config import load
    from mha_trace.render_heads import compare_data, compare_renderables

    counts = _int_list(heads, "--heads")
    c = load(config).with_overrides(mask=mask.value if mask else None, pad=pad)
    views = run_compare(c, counts)
    if png:
        from mha_trace.plots import save_heatmaps

        save_heatmaps(png, f"{c.title}: heads {heads}",
                      [(f"H={v.heads} head {h + 1}", v.tokens, v.tokens, v.weights[h], v.mask)
                       for v in views for h in range(v.heads)], decimals)
    emit(Output(format, no_color, width, svg, html, _title()), compare_renderables(views, decimals),
         compare_data(views, decimals))


@app.command()
def ablate(
    head: Annotated[str, typer.Option("--head", help="Head(s) to remove, 1-based, comma-separated. Example: --head 2 or --head 1,3")] = "2",
    config: ConfigOpt = None,
    heads: ResplitOpt = None,
    kv_heads: KvHeadsOpt = None,
    mask: ConfigMaskOpt = None,
    pad: ConfigPadOpt = None,
    decimals: DecimalsOpt = 4,
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    debug: DebugOpt = False,
):
    """The output with some heads removed (zeroed before W_O), and how far each token moved.

    Example: mha-trace ablate --head 2
    """
    from mha_trace.analysis import ablate as run_ablate
    from mha_trace.config import load
    from mha_trace.render_heads import ablate_data, ablate_renderables

    removed = _int_list(head, "--head")
    c = load(config).with_overrides(heads, kv_heads, mask.value if mask else None, pad)
    a = run_ablate(c, removed)
    emit(Output(format, no_color, width, svg, html, _title()), ablate_renderables(a, decimals), ablate_data(a, decimals))


@app.command()
def configs(
    format: FormatOpt = Format.table,
    no_color: NoColorOpt = False,
    width: WidthOpt = None,
    svg: SvgOpt = None,
    html: HtmlOpt = None,
    debug: DebugOpt = False,
):
    """List the bundled configs: name, title, tokens, d_model, heads, and what each shows.

    Example: mha-trace configs
    """
    from mha_trace.config import bundled_names, load
    from mha_trace.render_configs import configs_data, configs_table

    found = [load(name) for name in bundled_names()]
    emit(Output(format, no_color, width, svg, html, _title()), [configs_table(found)], configs_data(found))


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


def main():
    """Console-script entry point."""
    try:
        app()
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    _exit(code)


def _exit(code: int):
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader went away (`mha-trace shapes | head`): not an error
        code = code or 0
    if "torch" in sys.modules:
        # torch's interpreter teardown alone costs about 0.3 s and nothing of ours needs it:
        # everything is written and flushed, so leave at once.
        os._exit(code)
    sys.exit(code)
