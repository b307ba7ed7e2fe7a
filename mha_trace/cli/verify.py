"""`verify`: the module (or the user's own) against independent references."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.core.clashes import judge, needs
from mha_trace.runs.course import course_names
from mha_trace.errors import MhaError
from mha_trace.io.output import Output, emit


@app.command(short_help="The module (or yours) against independent references.")
@output_options()
@run_options("sizes", "module")
def verify(
    config: Annotated[str | None, typer.Option("--config", "-c", help="Verify on a config's Q, K, V (or generated input) instead of random sizes from flags; --heads, --kv-heads, --mask and --pad override the config's. Example: --config chicken-road")] = None,
    map_: Annotated[str | None, typer.Option("--map", help="With --module: which of your layers is which projection, when names and shapes do not tell. Example: --map 'q=W_Q,k=W_K,v=W_V,o=W_O'")] = None,
    mask_means: Annotated[str, typer.Option("--mask-means", help="With --module and a mask: what your module's boolean mask means. keep: True where a query may attend (the lecture's); blocked: True where it may not (nn.MultiheadAttention's, the chapter's class's); any: both are tried, and the one that matches is said. Example: --mask-means keep")] = "any",
    course: Annotated[str | None, typer.Option("--course", help=f"With --module: a course's conventions, so that a mask read the other way round is Wrong, not Right with a note: {', '.join(course_names())}, or a profile's .toml file of your own (title, convention, mask_means, mask, d_model, heads, seq, batch). Example: --course cs231n", metavar="NAME")] = None,
    o=None,
    out: Output = None,
):
    """Check the module against numpy by hand, nn.MultiheadAttention and F.scaled_dot_product_attention.

    With --module, check your own class instead: the lecture module's weights are copied into it,
    both run on the same input, and a wrong one is shown its first wrong step and a diagnosis.

    Exits 1 when any difference exceeds the dtype's tolerance.
    Example: mha-trace verify --heads 8 --kv-heads 2 --mask causal --dtype float64
    Example: mha-trace verify --rope --window 4 --kv-heads 2 --dtype float64
    Example: mha-trace verify --module example:l04 --d-model 64 --heads 4
    Example: mha-trace verify --module example:rope_pairs --rope --mask causal
    """
    from dataclasses import replace

    o = replace(o, config=config)
    judge({"course": course, "module": o.module}, (needs("course", "module", "holds a course's conventions for your module"),))
    if o.module:
        from mha_trace.views.verify import student_verdict

        report = student_verdict(o, map_, mask_means, course)
    else:
        report = _builtin(o, map_, mask_means)
    from mha_trace.io.output import make_console

    console = make_console(out)
    emit(out, lambda: report.renderables(console.width), report.data, console)
    if not report.passed:
        raise typer.Exit(1)


SMALLER = "verify on smaller sizes: the check does not depend on them"


def _builtin(o, map_: str | None, mask_means: str):
    """The built-in module against the references, at sizes from flags or on a config."""
    from mha_trace.analyses.references import check_references
    from mha_trace.runs.resolve import resolve

    if map_ or o.init or mask_means != "any":
        raise MhaError("--map, --mask-means and --init go with --module")
    if o.config is None:
        return check_references(resolve(o, "sizes", alive=4, hint=SMALLER))
    fixed = [f for f, v in (("--batch", o.batch), ("--seq", o.seq), ("--d-model", o.d_model),
                            ("--seed", o.seed)) if v is not None]
    if fixed:
        raise MhaError(f"{', '.join(fixed)} {'goes' if len(fixed) == 1 else 'go'} with sizes "
                       f"from flags; a config fixes its tokens, width and seed")
    if o.impl != "explicit":
        raise MhaError("impl goes with sizes from flags (a config runs the explicit module)",
                       quantity="impl")
    return check_references(resolve(o, "config"))
