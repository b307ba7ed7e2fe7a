"""`train`: a tiny attention-only transformer trained from scratch, heads snapshotted as they form."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import output_options
from mha_trace.io.output import Output, emit

TASK_HELP = ("induction (a repeated segment: its next tokens), previous-token, difference "
             "((x[t-1] - x[t-2]) mod V), copy (half a sequence back), reverse")


@app.command(short_help="Train a tiny attention-only model and watch its heads specialise.")
@output_options(png=True, scale=False)
def train(
    task: Annotated[str, typer.Option("--task", help=f"The toy task: {TASK_HELP}. Example: --task previous-token", metavar="TASK")] = "induction",
    layers: Annotated[int | None, typer.Option("--layers", min=1, max=8, help="Attention layers (default: the task's: 2 for induction, else 1). Example: --layers 2")] = None,
    heads: Annotated[int | None, typer.Option("--heads", min=1, max=16, help="Heads a layer (default: the task's: 4, or 2 for difference). Example: --heads 4")] = None,
    d_model: Annotated[int, typer.Option("--d-model", min=4, max=512, help="Width of the residual stream. Example: --d-model 64")] = 64,
    vocab: Annotated[int, typer.Option("--vocab", min=2, max=1000, help="Tokens in the vocabulary (chance is ln V). Example: --vocab 16")] = 16,
    seq: Annotated[int, typer.Option("--seq", min=4, max=256, help="Tokens a sequence (even). Example: --seq 32")] = 32,
    batch: Annotated[int, typer.Option("--batch", min=1, max=1024, help="Sequences a step. Example: --batch 32")] = 32,
    steps: Annotated[int | None, typer.Option("--steps", min=1, max=100_000, help="Optimiser steps (default: the task's: 600 for induction). Example: --steps 1500")] = None,
    lr: Annotated[float | None, typer.Option("--lr", min=1e-6, max=1.0, help="AdamW's learning rate (default: the task's). Example: --lr 0.003")] = None,
    seed: Annotated[int, typer.Option("--seed", min=0, help="Seeds the weights, the data and the probe: the same seed, the same run. Example: --seed 1")] = 0,
    rope: Annotated[bool, typer.Option("--rope", help="RoPE on q and k in every layer instead of learned positions (then explain --checkpoint --rope-planes splits its scores by plane). Example: --rope")] = False,
    identical_heads: Annotated[bool, typer.Option("--identical-heads", help="Exercise 3: every head of a layer starts with the same weights (and stays so). Example: --task difference --identical-heads")] = False,
    snapshots: Annotated[int, typer.Option("--snapshots", min=2, max=200, help="Snapshots kept, log-spaced from step 0 to the last. Example: --snapshots 40")] = 20,
    save_to: Annotated[str | None, typer.Option("--save", help="Save the run (weights at every snapshot, the optimiser, the data's generator) for heads --checkpoint and --resume. Example: --save run.pt", metavar="FILE")] = None,
    resume: Annotated[str | None, typer.Option("--resume", help="Go on from a saved run to --steps (its task and sizes are kept). Example: --resume run.pt --steps 2000", metavar="FILE")] = None,
    out: Output = None,
):
    """Train a tiny attention-only transformer (the lecture's MultiHeadAttention, layers of it with
    residual connections, no MLP) on a toy task from scratch, and watch its heads specialise:
    snapshots of every head on a fixed probe, the step each became a previous-token or an
    induction head, and the loss. Deterministic for a seed.

    Example: mha-trace train --task previous-token --steps 200
    Example: mha-trace train --task difference --identical-heads --steps 700 --snapshots 4
    """
    import sys

    from mha_trace.io.output import progress
    from mha_trace.views.train import TrainRequest, train_view

    given = {"layers": (layers, None), "heads": (heads, None), "d_model": (d_model, 64),
             "vocab": (vocab, 16), "seq": (seq, 32), "batch": (batch, 32), "steps": (steps, None),
             "lr": (lr, None), "seed": (seed, 0), "identical_heads": (identical_heads, False),
             "rope": (rope, False), "snapshots": (snapshots, 20)}
    settings = {name: value for name, (value, default) in given.items() if value != default}
    r = train_view(TrainRequest(task, settings, resume, save_to), progress,
                   lambda line: print(line, file=sys.stderr))
    emit(out, r.renderables, r.data, slide=r)
