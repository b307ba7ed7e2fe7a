"""`cost`: parameters, FLOPs, memory and KV cache, by arithmetic alone (no torch on its path)."""

from typing import Annotated

import typer

from mha_trace.cli.app import app
from mha_trace.cli.options import *  # noqa: F403 (the shared option types)
from mha_trace.core.presets import preset_names
from mha_trace.io.output import Output, emit


@app.command(short_help="Parameters, FLOPs, score memory and KV cache, exactly.")
@output_options()
def cost(
    preset: Annotated[str | None, typer.Option("--preset", help=f"Published model dimensions: {', '.join(preset_names())}; flags override them. Example: --preset gpt3-175b")] = None,
    batch: Annotated[int | None, typer.Option("--batch", "-b", help="Batch size B (default 1 with a preset, else 2). Example: --batch 8")] = None,
    seq: Annotated[int | None, typer.Option("--seq", "-t", help="Sequence length T (default: the preset's context, else 10). Example: --seq 4096")] = None,
    d_model: Annotated[int | None, typer.Option("--d-model", "-d", help="Model width (default 512). Example: --d-model 8192")] = None,
    heads: Annotated[int | None, typer.Option("--heads", "-H", help="Query heads (default 8). Example: --heads 64")] = None,
    kv_heads: KvHeadsOpt = None,
    layers: Annotated[int | None, typer.Option("--layers", "-L", help="Number of layers (default 1). Example: --layers 80")] = None,
    dtype: DtypeOpt = Dtype.float32,
    bias: Annotated[bool | None, typer.Option("--bias/--no-bias", help="Projection biases (default: the preset's, else yes). Example: --no-bias")] = None,
    formulas: Annotated[bool, typer.Option("--formulas", help="Show each formula with the numbers put in. Example: --formulas")] = False,
    window: Annotated[int | None, typer.Option("--window", help="Sliding-window attention: the KV cache keeps at most W tokens per layer (default: the preset's). Example: --window 4096")] = None,
    rope: Annotated[bool | None, typer.Option("--rope/--no-rope", help="Rotary positions (default: the preset's); they add no parameters. Example: --rope")] = None,
    head_dim: Annotated[int | None, typer.Option("--head-dim", help="A head's width d_k when it is not d_model / heads (default: the preset's; Gemma 2 256, gpt-oss 64). Example: --head-dim 128")] = None,
    local_global: Annotated[str | None, typer.Option("--local-global", help="With --window: LOCAL:GLOBAL layers a cycle, the local ones windowed, the global ones seeing every key (Gemma 2 and gpt-oss 1:1, Gemma 3 5:1; default: the preset's). Example: --window 1024 --local-global 5:1", metavar="L:G")] = None,
    sinks: Annotated[int | None, typer.Option("--sinks", min=0, help="With --window: the first S tokens kept beside the window in every windowed layer, as StreamingLLM keeps its attention sinks (default 0). Example: --window 4096 --sinks 4")] = None,
    sink_logits: Annotated[bool | None, typer.Option("--sink-logits/--no-sink-logits", help="A learned logit a head that joins every softmax row, as gpt-oss's sinks (one parameter a head; default: the preset's). Example: --sink-logits")] = None,
    qk_norm: QkNormOpt = False,
    alibi: AlibiOpt = False,
    relative_bias: RelativeBiasOpt = False,
    off_by_one: OffByOneOpt = False,
    latent: Annotated[int | None, typer.Option("--latent", help="Multi-head latent attention (DeepSeek-V2's MLA): keys and values come up from one latent of D_C dims a token, which with one RoPE key of d_R dims is all the cache keeps (an MLA preset's d_c overridden). Example: --latent 512 --rope-dim 64", metavar="D_C")] = None,
    rope_dim: Annotated[int | None, typer.Option("--rope-dim", help="With --latent: d_R, the dims of the RoPE key every head shares (default d_k / 2, or the preset's). Example: --latent 512 --rope-dim 64")] = None,
    softcap: SoftcapOpt = None,
    diff: DiffOpt = False,
    cross_keys: Annotated[int | None, typer.Option("--cross-keys", help="A decoder's cross-attention beside its self-attention: the encoder positions its queries see (default: the preset's; 0 for none). Example: --preset whisper-tiny-en --cross-keys 1500", metavar="S")] = None,
    io: Annotated[bool, typer.Option("--io", help="Count the bytes each kernel reads from and writes to main memory (HBM): standard attention against the tiled pass (FlashAttention-2's loop). Example: --preset gpt2-medium --batch 64 --dtype float16 --io --backward")] = False,
    backward: Annotated[bool, typer.Option("--backward", help="With --io: the backward pass too (training), as in Dao et al. 2022, Fig. 2. Example: --io --backward")] = False,
    sram: Annotated[int | None, typer.Option("--sram", help="With --io: bytes of on-chip SRAM a tile may use (default 196608, an A100's 192 KB per streaming multiprocessor); the tiles follow from it. Example: --io --sram 98304")] = None,
    block_q: Annotated[int | None, typer.Option("--block-q", help="With --io: rows of a query tile (B_r), in both passes (default: from --sram). Example: --io --block-q 128")] = None,
    block_k: Annotated[int | None, typer.Option("--block-k", help="With --io: rows of a key/value tile (B_c), in both passes (default: from --sram). Example: --io --block-k 128")] = None,
    causal: Annotated[bool | None, typer.Option("--causal/--no-causal", help="With --io: a causal mask, a kernel of its own in standard attention (default: the preset's, else none). Example: --io --causal")] = None,
    dropout: Annotated[float | None, typer.Option("--dropout", help="With --io: attention dropout probability; above 0, a kernel of its own in standard attention (default: the preset's, else 0). Example: --io --dropout 0.1")] = None,
    out: Output = None,
):
    """Parameters, FLOPs per stage, score memory (materialised vs tiled) and KV cache, exactly;
    with --io, the main-memory traffic of standard and tiled attention, kernel by kernel.

    Example: mha-trace cost --preset gpt3-175b --seq 2048 --dtype float16
    Example: mha-trace cost --preset whisper-tiny-en
    Example: mha-trace cost --preset gpt-oss-20b --seq 32768 --dtype bfloat16
    """
    from mha_trace.views.cost import cost_view

    report = cost_view(preset, batch, seq, d_model, heads, kv_heads, layers, dtype.value, bias,
                         window, rope, formulas, io, backward, sram, block_q, block_k, causal,
                         dropout, cross_keys, head_dim, local_global, sinks, sink_logits,
                         qk_norm=qk_norm, alibi=alibi, softcap=softcap, diff=diff, relative_bias=relative_bias,
                         latent=latent, rope_dim=rope_dim, off_by_one=off_by_one)
    emit(out, report.renderables, report.data)
