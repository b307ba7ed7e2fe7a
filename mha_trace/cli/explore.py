"""`explore`: the live lecture explorer (Textual, imported only here)."""

import os
import sys
from enum import Enum
from typing import Annotated

import typer

from mha_trace.cli.app import app, debugging
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.errors import MhaError
from mha_trace.io.streams import tool_stdout

Pane = Enum("Pane", {p: p for p in ("trace", "heads", "token", "split", "ablate")}, type=str)
ExploreMask = Enum("ExploreMask", {m: m for m in ("none", "causal", "window")}, type=str)

ExploreThemeOpt = Annotated[Theme, typer.Option("--theme", help="The explorer's colours: dark, or light for a white projector screen (d switches live). Example: --theme light")]
PaneOpt = Annotated[Pane, typer.Option("--pane", help="The pane to open on: trace, heads, token, split or ablate. Example: --pane heads")]
ExploreSeqOpt = Annotated[int | None, typer.Option("--seq", "-t", help="With --d-model: tokens in the run (at most 64). Example: --seq 6")]
ExploreDModelOpt = Annotated[int | None, typer.Option("--d-model", "-d", help="A run given by sizes instead of a config (weights and tokens t1..tT drawn from seed 0). Example: --d-model 512")]
ExploreHeadsOpt = Annotated[int | None, typer.Option("--heads", "-H", help="Heads to start with (+ and - re-split live). Example: --heads 4")]
ExploreMaskOpt = Annotated[ExploreMask | None, typer.Option("--mask", help="The mask to start with: none, causal or window (m cycles them live). Example: --mask causal")]


@app.command(short_help="The live lecture explorer: trace, heads, a token, head count, ablation.")
def explore(
    config: ConfigOpt = None,
    model: PretrainedOpt = None,
    checkpoint: CheckpointOpt = None,
    at_step: AtStepOpt = None,
    sentence: SentenceOpt = None,
    layer: LayerOpt = None,
    d_model: ExploreDModelOpt = None,
    heads: ExploreHeadsOpt = None,
    seq: ExploreSeqOpt = None,
    mask: ExploreMaskOpt = None,
    pane: PaneOpt = Pane.trace,
    theme: ExploreThemeOpt = Theme.dark,
    debug: DebugOpt = False,
):
    """Move through a real forward pass, pick a head and a token, re-split the heads, switch
    heads off and change the mask, live, with the keyboard (? lists the keys, q quits).

    Torch is loaded once; every view is the record the other commands print.
    Example: mha-trace explore
    Example: mha-trace explore --model minilm --sentence "The animal didn't cross the street because it was too tired."
    Example: mha-trace explore --d-model 512 --heads 8
    Example: mha-trace explore --checkpoint run.pt --at-step 600
    """
    from mha_trace.runs.resolve import RunOptions, with_checkpoint
    from mha_trace.explorer.session import prepare

    model = with_checkpoint(RunOptions(model=model, checkpoint=checkpoint, at_step=at_step)).model
    pane, mask = pane.value, mask and mask.value
    open_session = prepare(config, model, sentence, layer, d_model, heads, seq, mask, pane)
    terminal = tool_stdout()
    if not (sys.stdin and sys.stdin.isatty() and terminal.isatty()):
        raise MhaError("explore is interactive and needs a terminal; in scripts use shapes, heads "
                       "or explain (with --step for a paced demo)")
    if not (sys.__stderr__ and sys.__stderr__.isatty()):
        # Textual draws on stderr: hidden (2>/dev/null), it draws on the terminal stdout is
        os.dup2(terminal.fileno(), sys.__stderr__.fileno() if sys.__stderr__ else 2)
    from mha_trace.explorer.app import Explorer

    explorer = Explorer(open_session, theme.value, pane, debug=debug or debugging())
    explorer.run()
    if explorer.failure is not None:
        raise explorer.failure
    if explorer.return_code == 130:  # Ctrl-C: the interruption every command reports
        raise KeyboardInterrupt
