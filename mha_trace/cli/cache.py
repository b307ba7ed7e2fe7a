"""The `cache` command: the KV-cache lab."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.io.output import Output, emit


@app.command(short_help="The KV-cache lab: what evicting the cache costs a real model.")
@output_options(png=True, scale=False)
def cache(
    model: Annotated[str | None, typer.Option("--model", help="A causal model that decodes with a KV cache: smollm2 (the default). Example: --model smollm2", metavar="NAME")] = None,
    checkpoint: CheckpointOpt = None,
    at_step: AtStepOpt = None,
    policy: Annotated[str, typer.Option("--policy", help="Eviction policies, comma-separated: full (keep everything), window (the last B tokens), sinks (the first --sinks and the last B - sinks), h2o (the sinks, the last B/2 and the keys that received the most attention). Example: --policy full,window,sinks")] = "full,window,sinks,h2o",
    budget: Annotated[str, typer.Option("--budget", help="Cache sizes B in tokens, the token being read included, comma-separated. Example: --budget 32,64")] = "64,128,256",
    sinks: Annotated[int, typer.Option("--sinks", min=1, max=64, help="How many first tokens the sinks and h2o policies always keep. Example: --sinks 4")] = 4,
    tokens: Annotated[int, typer.Option("--tokens", min=16, max=4096, help="How many tokens of the text to read (BOS included). Example: --tokens 256")] = 512,
    text: Annotated[str | None, typer.Option("--text", help="Read this text file instead of the bundled corpus. Example: --text essay.txt", metavar="FILE")] = None,
    renumber: Annotated[bool, typer.Option("--renumber", help="Also number positions inside the cache (0 .. B-1), as StreamingLLM does, in a second column; decodes token by token. Example: --renumber")] = False,
    max_seconds: MaxSecondsOpt = None,
    device: ComputeDeviceOpt = Device.cpu,
    out: Output = None,
):
    """The KV-cache lab: a text read token by token with a cache of at most B tokens, under each
    eviction policy and budget: the next-token loss and perplexity, the cache's bytes (cost's
    formula), and which positions each cache holds at the end (the time follows on stderr at a
    terminal; --format json has it).

    The default text is the bundled corpus (its 120 sentences in order, joined by spaces), BOS
    first, the first 512 tokens; for a trained run (--checkpoint run.pt), its probe sequence.
    full, window and sinks run as one masked pass (exactly equal to decoding: keys keep their
    positions); h2o a layer at a time, its cache's evictions replayed over each layer's weights
    (exactly equal to decoding too); --renumber decodes token by token. Settings that replay or
    decode run together, a batch row each.

    Example: mha-trace cache --model smollm2 --tokens 128 --budget 32,64 --policy full,window,sinks
    """
    from mha_trace.io.files import check_outputs
    from mha_trace.io.output import progress
    from mha_trace.runs.resolve import RunOptions
    from mha_trace.views.cache import CacheRequest, cache_view

    check_outputs({"png": out.png, "svg": out.svg, "html": out.html}, [text])
    o = RunOptions(model=model, checkpoint=checkpoint, at_step=at_step, device=device.value,
                   max_seconds=max_seconds)
    lab = cache_view(CacheRequest(o, policy, budget, sinks, tokens, None, text, renumber), progress)
    emit(out, lab.renderables, lab.data, slide=lab)
    import sys

    if sys.stderr.isatty():
        from mha_trace.render.kvcache import timing

        print(timing(lab), file=sys.stderr)
