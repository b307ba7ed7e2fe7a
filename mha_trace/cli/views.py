"""`heads`, `explain`, `compare`, `ablate` and `configs`: what the heads compute on a config."""

from typing import Annotated

import typer

from mha_trace.cli.app import _title, app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.errors import MhaError
from mha_trace.output import Format, Output, emit


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


def _load_module_heads(module, init, config, d_model, heads, mask, pad, head):
    from mha_trace.analysis import module_heads
    from mha_trace.config import load
    from mha_trace.validate import heads_divide

    d_model, heads = d_model or 64, heads or 4
    if init is None:
        heads_divide(d_model, heads)
    c = load(config).with_overrides(mask=mask.value if mask else None, pad=pad)
    m = module_heads(module, init, c, d_model, heads)
    if head is not None and not 1 <= head <= len(m.weights):
        raise MhaError(f"--head {head} is out of range (the module returned {len(m.weights)} "
                       f"weight map{'s' if len(m.weights) > 1 else ''})")
    return m


def _module_heads(module, init, config, d_model, heads, mask, pad, head, decimals, out):
    from mha_trace.render_heads import module_heads_data, module_heads_renderables

    m = _load_module_heads(module, init, config, d_model, heads, mask, pad, head)
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
    module: ModuleOpt = None,
    init: InitOpt = None,
    d_model: Annotated[int | None, typer.Option("--d-model", "-d", help="With --module: the width to build it with (default 64). Example: --d-model 64")] = None,
    debug: DebugOpt = False,
):
    """One token through every head: q·k written out for each key, ÷√d_k, softmax, Σ w·v, concat, W_O.

    Example: mha-trace explain --token cat
    """
    from mha_trace.analysis import find_position, walk
    from mha_trace.render_heads import explain_data, explain_renderables

    out = Output(format, no_color, width, svg, html, _title())
    if module:
        from mha_trace.render_heads import module_explain_data, module_explain_renderables

        m = _load_module_heads(module, init, config, d_model, heads, mask, pad, head)
        i = find_position(m.tokens, token, position)
        emit(out, module_explain_renderables(m, i, decimals, head),
             module_explain_data(m, i, decimals, head))
        return
    if d_model is not None:
        raise MhaError("--d-model goes with --module (a config's width is fixed by the config)")
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
    emit(out, explain_renderables(w, decimals, head), explain_data(w, decimals, head))


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


