"""`verify`: the module (or the user's own) against independent references."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.runs.course import course_names
from mha_trace.io.output import Output, emit


@app.command(short_help="The module (or yours) against independent references.")
@output_options()
@run_options("sizes", "scoring", "latent", "module")
def verify(
    config: Annotated[str | None, typer.Option("--config", "-c", help="Verify on a config's Q, K, V (or generated input) instead of random sizes from flags; --heads, --kv-heads, --mask and --pad override the config's. Example: --config chicken-road")] = None,
    map_: Annotated[str | None, typer.Option("--map", help="With --module: which of your layers is which projection, when names and shapes do not tell. Example: --map 'q=W_Q,k=W_K,v=W_V,o=W_O'")] = None,
    mask_means: Annotated[str, typer.Option("--mask-means", help="With --module and a mask: what your module's boolean mask means. keep: True where a query may attend (the lecture's); blocked: True where it may not (nn.MultiheadAttention's, the chapter's class's); any: both are tried, and the one that matches is said. Example: --mask-means keep")] = "any",
    course: Annotated[str | None, typer.Option("--course", help=f"With --module: a course's conventions, so that a mask read the other way round is Wrong, not Right with a note: {', '.join(course_names())}, or a profile's .toml file of your own (title, convention, mask_means, mask, d_model, heads, seq, batch). Example: --course cs231n", metavar="NAME")] = None,
    gradebook: Annotated[str | None, typer.Option("--gradebook", help="With a --module that names a class (a glob or a folder), or one file: write grades.csv, grades.json, Gradescope's results.json and grades.html into this folder. Example: --gradebook grades/", metavar="DIR")] = None,
    jobs: Annotated[int | None, typer.Option("--jobs", min=1, max=256, help="With a class: submissions verified at once (default: one per core). Example: --jobs 2")] = None,
    time_limit: Annotated[float | None, typer.Option("--time-limit", min=1, max=3600, help="With a class: each submission's seconds before it is stopped (default: 30). Example: --time-limit 60")] = None,
    memory: Annotated[float | None, typer.Option("--memory", min=0.25, max=1024, help="With a class: each submission's memory in GiB, beyond what torch itself takes (default: 4). Example: --memory 8")] = None,
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

    With --impl tiled, check a FlashAttention forward of your own (CS336's: a torch.autograd.Function
    or a function, called (Q, K, V, is_causal)) tile by tile against the lecture's walk.
    Example: mha-trace verify --module examples/tiled/flash_cs336.py:FlashAttention --impl tiled --mask causal

    With a --module whose file is a glob or a folder, verify a whole class: each submission in a
    process of its own (a time limit, a memory limit, no network, writes only in a scratch
    folder), then a row per student and the class's mistakes counted; exits 0 once all are judged.
    Example: mha-trace verify --module 'class/*.py:MultiHeadAttention' --course cs231n --gradebook grades/
    """
    from dataclasses import replace

    from mha_trace.io.output import make_console, progress
    from mha_trace.views.verify import verify_view

    report = verify_view(replace(o, config=config), map_, mask_means, course, gradebook,
                         (jobs, time_limit, memory), progress)
    console = make_console(out)
    emit(out, lambda: report.renderables(console.width), report.data, console)
    if not report.passed:
        raise typer.Exit(1)
