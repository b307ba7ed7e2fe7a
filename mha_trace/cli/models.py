"""The commands only a model has: `survey` (which layer.head does what), `predict` (a causal
model's next token) and `ablate --prune` (the pruning curve). `heads`, `explain`, `shapes` and
`ablate` read a model through their own path (cli/heads.py, cli/shapes.py)."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.io.output import Output, emit, make_console

@app.command(short_help="Which layer.head of a model does what, ranked.")
@output_options(png=lambda o: None if o["composition"] or o["audio"] else (
    "--png draws the composition slide or Whisper's alignment slide: it goes with --composition or --audio"),
    scale=False)
def survey(
    model: Annotated[str, typer.Option("--model", help="The pretrained model: minilm, smollm2, or whisper (it hears --audio FILE). Example: --model minilm", metavar="NAME")] = "minilm",
    sentence: Annotated[str | None, typer.Option("--sentence", "-s", help="Score heads on this one text instead of the bundled corpus. Example: --sentence \"The cat sat on the mat.\"")] = None,
    checkpoint: CheckpointOpt = None,
    at_step: AtStepOpt = None,
    sentences: Annotated[str | None, typer.Option("--sentences", help="Score heads on the sentences of this file, one a line (# starts a comment line). Example: --sentences my.txt", metavar="FILE")] = None,
    corpus: Annotated[bool, typer.Option("--corpus", help="Score heads on the bundled corpus: 120 sentences written for mha-trace, 36 of them with \"it\" and a known antecedent (the default without --sentence or --sentences). Example: --corpus")] = False,
    source: Annotated[str | None, typer.Option("--from", help="Coreference probe: the word that refers (with --to). Example: --from it")] = None,
    targets: Annotated[str | None, typer.Option("--to", help="Coreference probe: the candidate words, comma-separated. Example: --to animal,street")] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=20, help="How many heads to list per behaviour. Example: --top 5")] = 3,
    grids: Annotated[bool, typer.Option("--grids", help="Also every behaviour's layer × head grid of mean scores (--format json always has them, with the spread and the share held). Example: --grids")] = False,
    induction: Annotated[bool, typer.Option("--induction", help="With a causal model: 50 random whole-word tokens repeated twice (three seeds); each head's induction score, the previous-token heads below, and the loss on both halves. Example: --model smollm2 --induction")] = False,
    ablate_top: Annotated[int, typer.Option("--ablate-top", min=0, max=50, help="With --induction: also the repeated half's loss with the K best induction heads removed. Example: --ablate-top 5")] = 0,
    composition: Annotated[bool, typer.Option("--composition", help="With a decoder (smollm2, --checkpoint): Q-, K- and V-composition of every head with every head of an earlier layer, from the weights, beside random matrices of the same shapes; for a trained run, whom its induction heads read. Example: --model smollm2 --composition")] = False,
    rope_planes: Annotated[bool, typer.Option("--rope-planes", help="With a RoPE model (smollm2): each head's |q·k| by band of rotation planes over the sentences, beside its previous-token score. Example: --model smollm2 --rope-planes")] = False,
    effect: Annotated[bool, typer.Option("--effect", help="Also, per layer, the share of weight and the share of effect (weight × the length of what the key's value moves through W_O, renormalised) that go to the sinks, and what that says. Example: --effect")] = False,
    audio: AudioOpt = None,
    alignment: Annotated[bool, typer.Option("--alignment", help="With --model whisper (the survey it runs): each decoder cross-attention head ranked by how well it follows the sound, beside the model's published alignment heads. Example: --model whisper --audio talk.wav --alignment")] = False,
    timestamps: Annotated[bool, typer.Option("--timestamps", help="With --model whisper: also each word's start and end, from the alignment heads as Whisper computes them, on a time axis. Example: --model whisper --audio talk.wav --timestamps")] = False,
    max_tokens: MaxTokensOpt = None,
    device: ComputeDeviceOpt = Device.cpu,
    out: Output = None,
):
    """Which layer.head does what, over many sentences: previous token, next token, self, the
    first token or [CLS]/[SEP] as a sink, punctuation, duplicate tokens, induction, and where
    "it" looks when its antecedent is the subject and when it is the object. Each head's mean,
    spread and the share of sentences where it holds, beside chance.

    With --induction (a causal model), the heads that copy what followed a token's earlier copy.
    Example: mha-trace survey --model minilm
    Example: mha-trace survey --model smollm2 --sentences my.txt
    Example: mha-trace survey --model minilm --sentence "The animal didn't cross the street because it was too tired." --from it --to animal,street
    Example: mha-trace survey --model minilm --effect
    Example: mha-trace survey --checkpoint run.pt --composition --png composition.png
    Example: mha-trace survey --model smollm2 --induction --ablate-top 5
    Example: mha-trace survey --checkpoint run.pt
    Example: mha-trace survey --model smollm2 --rope-planes --sentence "The cat sat on the mat because the cat was tired."
    Example: mha-trace survey --model whisper --audio examples/audio/cat.wav --alignment --timestamps
    """
    from mha_trace.io.output import progress
    from mha_trace.runs.resolve import RunOptions
    from mha_trace.views.survey import SurveyRequest, survey_view

    o = RunOptions(model=None if checkpoint else model, checkpoint=checkpoint, at_step=at_step,
                   device=device.value, max_tokens=max_tokens, audio=audio, sentence=sentence)
    result = survey_view(SurveyRequest(o, sentences, corpus, source, targets, effect, rope_planes,
                                       composition, induction, ablate_top, alignment, timestamps,
                                       grids), progress)
    console = make_console(out)
    if audio is not None:
        return emit(out, lambda: result.renderables(console.width), result.data, console,
                    page=result, slide=result)
    if composition:
        return emit(out, lambda: result.renderables(top=max(top, 5)), result.data, slide=result)
    if induction or ablate_top:
        shown = max(top, ablate_top, 5)
        return emit(out, lambda: result.renderables(top=shown), lambda: result.data(top=shown))
    emit(out, lambda: result.renderables(console.width, top=top, grids=grids),
         lambda: result.data(top=top), console)


@app.command(short_help="A causal model's next-token distribution.")
@output_options()
def predict(
    model: Annotated[str, typer.Option("--model", help="A causal model: smollm2. Example: --model smollm2", metavar="NAME")] = "smollm2",
    sentence: Annotated[str, typer.Option("--sentence", "-s", help="The text to continue (plain, no chat template). Example: --sentence \"The capital of France is\"")] = "The capital of France is",
    top: Annotated[int, typer.Option("--top", min=1, max=100, help="How many next tokens to list. Example: --top 5")] = 10,
    generate: Annotated[int, typer.Option("--generate", min=0, max=200, help="Also continue greedily for N tokens. Example: --generate 8")] = 0,
    max_tokens: MaxTokensOpt = None,
    device: ComputeDeviceOpt = Device.cpu,
    out: Output = None,
):
    """A causal model's next-token distribution: the top tokens with their probabilities.

    Example: mha-trace predict --model smollm2 --sentence "The capital of France is" --generate 5
    """
    from mha_trace.io.output import progress
    from mha_trace.runs.resolve import RunOptions
    from mha_trace.views.predict import PredictRequest, predict_view

    o = RunOptions(model=model, device=device.value, max_tokens=max_tokens)
    p = predict_view(PredictRequest(o, sentence, top, generate), progress)
    emit(out, p.renderables, p.data)


@app.command(short_help="Which activations carry the difference between two texts (activation patching).")
@output_options(png=True, scale=False)
def patch(
    model: Annotated[str, typer.Option("--model", help="A causal model: smollm2 (or --checkpoint). Example: --model smollm2", metavar="NAME")] = "smollm2",
    checkpoint: CheckpointOpt = None,
    at_step: AtStepOpt = None,
    clean: Annotated[str | None, typer.Option("--clean", help="The clean text (default: an indirect-object sentence; a run's probe). Example: --clean \"When Mary and John went to the store, John gave a drink to\"")] = None,
    corrupt: Annotated[str | None, typer.Option("--corrupt", help="The corrupted text, as many tokens as --clean (default: the subject renamed; the probe with its first half re-drawn). Example: --corrupt \"When Mary and John went to the store, Mary gave a drink to\"")] = None,
    metric: Annotated[str | None, typer.Option("--metric", help="logit-diff:A,B (the logit of token A minus B's at the last position), loss (the next-token loss on the tokens both texts share) or, with --receiver, induction (the receiver's induction score). Example: --metric \"logit-diff: Mary, John\"")] = None,
    noising: Annotated[bool, typer.Option("--noising", help="Copy from the corrupted run into the clean one (the share each activation destroys) instead of clean into corrupted (the share it restores). Example: --noising")] = False,
    sender: Annotated[str | None, typer.Option("--sender", help="Path patching: the head whose output is copied (with --receiver), or several, comma-separated, copied together. Example: --sender 1.1,1.2 --receiver 2.4")] = None,
    receiver: Annotated[str | None, typer.Option("--receiver", help="Path patching: the later head that receives it, through its queries, keys or values alone (a trained run's metric defaults to this head's induction score). Example: --receiver 2.4")] = None,
    by_input: Annotated[bool, typer.Option("--by-input", help="Also patch each head's queries alone and each K/V group's keys and values (on SmolLM2 one K/V group serves three query heads: patching it moves all three). Example: --by-input")] = False,
    by_position: Annotated[str | None, typer.Option("--by-position", help="One head's output patched one position at a time: where it carries the difference. Example: --by-position 24.1", metavar="L.H")] = None,
    top: Annotated[int, typer.Option("--top", min=1, max=50, help="How many heads to name. Example: --top 5")] = 8,
    max_tokens: MaxTokensOpt = None,
    max_seconds: MaxSecondsOpt = None,
    device: ComputeDeviceOpt = Device.cpu,
    out: Output = None,
):
    """Activation patching: run a clean and a corrupted text, copy one activation from one run into
    the other, and measure how much of the metric's gap it carries: the residual stream entering
    each layer at each position, then each head's output. Without --clean and --corrupt: an
    indirect-object sentence (SmolLM2, about 4 seconds) or a run's probe.

    Example: mha-trace patch --model smollm2 --clean "The capital of France is" --corrupt "The capital of Italy is" --metric "logit-diff: Paris, Rome"
    Example: mha-trace patch --checkpoint run.pt --noising
    Example: mha-trace patch --checkpoint run.pt --by-input --by-position 2.1 --html patch.html --png patch.png
    Example: mha-trace patch --checkpoint run.pt --sender 1.1 --receiver 2.4
    """
    from mha_trace.io.output import progress
    from mha_trace.runs.resolve import RunOptions
    from mha_trace.views.patch import PatchRequest, patch_view

    o = RunOptions(model=None if checkpoint else model, checkpoint=checkpoint, at_step=at_step,
                   device=device.value, max_tokens=max_tokens, max_seconds=max_seconds)
    result = patch_view(PatchRequest(o, clean, corrupt, metric, noising, sender, receiver,
                                     by_input, by_position), progress)
    if sender is not None:
        return emit(out, result.renderables, result.data, page=result, slide=result)
    emit(out, lambda: result.renderables(top=top), result.data, page=result, slide=result)
