"""Option types and choices shared by the commands, and the output options declared once.

No torch here: `--help` imports this file.
"""

import functools
import inspect
from enum import Enum
from typing import Annotated, Callable

import typer

from mha_trace.errors import MhaError
from mha_trace.io.files import check_outputs
from mha_trace.io.output import Format, Output


from mha_trace.runs.resolve import CHOICES  # noqa: E402 (each option's values, declared there once)

Device = Enum("Device", {v: v for v in CHOICES["device"]}, type=str)
Dtype = Enum("Dtype", {v: v for v in CHOICES["dtype"]}, type=str)
Mask = Enum("Mask", {v: v for v in CHOICES["mask"]}, type=str)
Attention = Enum("Attention", {v: v for v in CHOICES["attention"]}, type=str)


# options shared by every command
FormatOpt = Annotated[Format, typer.Option("--format", "-f", help="table (rich, plain when piped), json or markdown. Example: --format json")]
NoColorOpt = Annotated[bool, typer.Option("--no-color", help="Plain text without colour or escape codes (NO_COLOR does the same). Example: --no-color")]
WidthOpt = Annotated[int | None, typer.Option("--width", min=40, help="Render at this many columns (default: the terminal's, 100 when piped). Example: --width 120")]
CheckpointOpt = Annotated[str | None, typer.Option("--checkpoint", help="A run saved by mha-trace train --save, as a model: its heads at a saved step, on token ids (default: the run's probe sequence). Example: --checkpoint run.pt", metavar="FILE")]
AtStepOpt = Annotated[int | None, typer.Option("--at-step", min=0, help="With --checkpoint: the saved step to look at (default: the last; train's snapshots list them). Example: --at-step 600")]
ModuleOpt = Annotated[str | None, typer.Option("--module", "-m", help="Trace your own class instead: FILE.py:Class, package.module:Class, or a bundled example:NAME (see mha-trace examples; this runs the code). Example: --module example:l04", metavar="SPEC")]
InitOpt = Annotated[str | None, typer.Option("--init", help="Constructor arguments for --module, as name=value pairs. Example: --init 'd_model=64, num_heads=4'")]


_MODEL_PNG = "; with --model and no --layer or --head, FILE gets an overview grid and FILE-layerN.png one figure per layer"


_PNG = {"ablate": "With --model M --prune: save the pruning curve (the loss against the heads removed) as a 1920×1080 PNG for slides",
        "survey": "With --composition: save the composition slide; with --model whisper --audio: the alignment slide (the sound, where each token listens, each head's disagreement); as a 1920×1080 PNG",
        "train": "Save the loss and each head's detector scores over the steps (curves) as a 1920×1080 PNG for slides"}


def _file_options(name: str) -> list:
    """--svg/--html/--png, their examples named after the command that shows them."""
    return [
        ("svg", Annotated[str | None, typer.Option("--svg", help=f"Also save what was printed as an SVG picture (for slides). Example: --svg {name}.svg", metavar="FILE")], None),
        ("html", Annotated[str | None, typer.Option("--html", help=f"Also save what was printed as HTML. Example: --html {name}.html", metavar="FILE")], None),
        ("png", Annotated[str | None, typer.Option("--png", help=f"{_PNG.get(name, 'Save per-head heatmaps as a 1920×1080 PNG for slides')}{_MODEL_PNG * (name == 'heads')} (needs matplotlib: pip install matplotlib). Example: --png {name}.png", metavar="FILE")], None)]


class Theme(str, Enum):
    dark = "dark"
    light = "light"


ScaleOpt = Annotated[float | None, typer.Option("--scale", help="With --png: the top of the colour scale (0 is always no attention): 1 for the same scale on every slide; by default the picture's largest weight. Example: --scale 1", metavar="TOP")]
ThemeOpt = Annotated[Theme, typer.Option("--theme", help="Colours of --svg, --html and --png pictures: dark, or light for white slides. Example: --theme light")]
StepOpt = Annotated[bool, typer.Option("--step", help="Paced for a lecture: one table row or section per key press (q shows the rest); does nothing when piped, so scripts keep working. Example: --step")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show Python tracebacks instead of one-line errors. Example: --debug")]

# sizes
BatchOpt = Annotated[int | None, typer.Option("--batch", "-b", help="Batch size B (default 2). Example: --batch 2")]
SeqOpt = Annotated[int | None, typer.Option("--seq", "-t", help="Sequence length T in tokens (default 10). Example: --seq 10")]
DModelOpt = Annotated[int | None, typer.Option("--d-model", "-d", help="Model width d_model (default 512); must be divisible by --heads. Example: --d-model 512")]
HeadsOpt = Annotated[int | None, typer.Option("--heads", "-H", help="Number of query heads H (default 8, or the config's); d_k = d_model / H. Example: --heads 8")]
KvHeadsOpt = Annotated[int | None, typer.Option("--kv-heads", help="Key/value heads (grouped-query attention; 1 is multi-query); must divide --heads. Example: --kv-heads 2")]
DeviceOpt = Annotated[Device, typer.Option("--device", help="Where to run; meta computes shapes without allocating memory. Example: --device meta")]
ComputeDeviceOpt = Annotated[Device, typer.Option("--device", help="Where to compute: cpu, cuda or mps (a model moves there once; meta holds no numbers to show). Example: --device cuda")]
DtypeOpt = Annotated[Dtype, typer.Option("--dtype", help="Tensor dtype. Example: --dtype bfloat16")]
MaskOpt = Annotated[Mask | None, typer.Option("--mask", help="none, or causal: no query looks at later keys (default none, or the config's). Example: --mask causal")]
PadOpt = Annotated[int | None, typer.Option("--pad", help="Mask the last N key positions as padding (default 0, or the config's). Example: --pad 2")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed for weights and inputs (default 0). Example: --seed 0")]

Impl = Enum("Impl", {v: v for v in CHOICES["impl"]}, type=str)


RopeOpt = Annotated[bool, typer.Option("--rope", help="Rotary positions (RoPE, as LLaMA): turn Q and K in each head by token position. With verify --module, the lecture's module turns Q and K to check yours. Example: --rope")]
RopeBaseOpt = Annotated[float | None, typer.Option("--rope-base", help="RoPE's base: pair i turns by position · base^(-2i/d_k) (default 10000, or the config's; LLaMA 10000, SmolLM2 100000). Example: --rope-base 100000")]
WindowOpt = Annotated[int | None, typer.Option("--window", help="Sliding-window attention (Mistral): a query sees at most W keys, itself included; implies a causal mask. Example: --window 4")]
QkNormOpt = Annotated[bool, typer.Option("--qk-norm", help="QK-norm (Qwen3, OLMo 2): an RMSNorm over each head's d_k dims of q and of k before q·k, so no score grows without bound. Example: --qk-norm")]
RelativeBiasOpt = Annotated[bool, typer.Option("--relative-bias", help="T5's relative position bias: add to each score a learned number of its head for the bucket of the offset j - i (32 buckets, one each for offsets below 8, log-spaced up to 128, as T5's encoder). Example: --relative-bias --config chicken-road")]
AlibiOpt = Annotated[bool, typer.Option("--alibi", help="ALiBi (BLOOM): add -m_h·|i - j| to each score, a slope m_h = 2^(-8h/H) a head, so a score falls with distance and no position is learned. Example: --alibi --mask causal")]
DiffOpt = Annotated[bool, typer.Option("--diff", help="Differential attention (DIFF Transformer): each head's q and k split in halves, two softmax maps, the second taken away λ times, each head's output RMS-normed and scaled by 1 - λ_init; weights may be negative and rows sum to 1 - λ. Example: --diff --mask causal")]
LatentOpt = Annotated[int | None, typer.Option("--latent", help="Multi-head latent attention (DeepSeek-V2's MLA) instead: keys and values come up from one latent of D_C dims a token, which with a shared RoPE key is all a cache keeps (heads and explain: on a generated config). Example: --latent 16", metavar="D_C")]
RopeDimOpt = Annotated[int | None, typer.Option("--rope-dim", help="How many of each head's query and key dims RoPE turns: with --rope the first R of d_k, the rest passed through (partial RoPE, as Phi; default all); with --latent, MLA's decoupled RoPE part d_R (default d_k / 2). Example: --rope --rope-dim 4")]
AbsorbedOpt = Annotated[bool, typer.Option("--absorbed", help="With --latent: the inference form, W_UK folded into each query and W_UV applied after the weights, so no head's key or value is formed (the same numbers). Example: --latent 16 --absorbed")]
SoftcapOpt = Annotated[float | None, typer.Option("--softcap", help="Logit soft-capping (Gemma 2 caps at 50): each score s becomes c·tanh(s / c), inside (-c, c), before the mask and softmax. Example: --softcap 2", metavar="C")]
SinkLogitsOpt = Annotated[bool, typer.Option("--sink-logits", help="A learned sink logit a head (gpt-oss): one more column in every row's softmax that no key stands behind, so a head may attend to nothing; the weights sum to less than 1. Example: --sink-logits")]
OffByOneOpt = Annotated[bool, typer.Option("--off-by-one", help="The off-by-one softmax (Miller 2023): the sink fixed at 0, exp(s_j) / (1 + Σ exp(s)). Example: --off-by-one")]
ConfigRopeBaseOpt = Annotated[float | None, typer.Option("--rope-base", help="RoPE's base (default: the config's, else 10000). Example: --rope-base 100000")]
ImplOpt = Annotated[Impl, typer.Option("--impl", help="explicit (the lecture's formula), sdpa (F.scaled_dot_product_attention, which never forms the weights) or tiled (FlashAttention-2's loop, tile by tile: a running max, sum and output, no T×T tensor). Example: --impl tiled")]

ConfigOpt = Annotated[str | None, typer.Option("--config", "-c", help="A TOML config file, or the name of a bundled one (see mha-trace configs); default: the chapter's 'The cat sat on mat'. Example: --config chicken-road")]
HeadOpt = Annotated[str | None, typer.Option("--head", help="Show only head N (1-based, as the chapter numbers them); with --model, LAYER.HEAD. Example: --head 2, or --head 4.1", metavar="N|L.H")]
PretrainedOpt = Annotated[str | None, typer.Option("--model", help="A pretrained model, loaded offline from its PyPI package: minilm (all-MiniLM-L6-v2) or smollm2 (SmolLM2-135M-Instruct). Example: --model minilm", metavar="NAME")]
SentenceOpt = Annotated[str | None, typer.Option("--sentence", "-s", help="With --model: the text to run (default: \"The animal didn't cross the street because it was too tired.\"). Example: --sentence \"The cat sat on the mat.\"")]
AudioOpt = Annotated[str | None, typer.Option("--audio", help="With --model whisper: the recording it hears (a WAV file, at most 30 s; other rates are resampled to 16 kHz). Example: --audio examples/audio/cat.wav", metavar="FILE")]
AttentionOpt = Annotated[Attention | None, typer.Option("--attention", help="With --model whisper --audio: cross (the decoder's text tokens look at the sound; the default), self (they look at each other: every text view, --why and --effect included, on what it wrote) or encoder (the sound's frames look at each other: heads, explain with --why and --effect, shapes). Example: --attention encoder")]
LayerOpt = Annotated[int | None, typer.Option("--layer", "-l", help="With --model: the layer (from 1). Example: --layer 4")]
ResplitOpt = Annotated[int | None, typer.Option("--heads", "-H", help="Re-split the same Q, K, V into H heads (must divide d_model). Example: --heads 4")]
ConfigMaskOpt = Annotated[Mask | None, typer.Option("--mask", help="Override the config's mask: none or causal. Example: --mask causal")]
ConfigPadOpt = Annotated[int | None, typer.Option("--pad", help="Mask the last N tokens as padding keys. Example: --pad 1")]
IncludeInputsOpt = Annotated[bool, typer.Option("--include-inputs", help="With --format json: also the run's inputs and weights at full precision (forward's arguments and every parameter), so anyone can recompute it. Example: --format json --include-inputs")]
EffectOpt = Annotated[bool, typer.Option("--effect", help="Also each weight times the length of what its key's value moves through W_O, renormalised (Kobayashi et al. 2020): a big weight on a token that moves nothing shrinks. Example: --effect")]
DecimalsOpt = Annotated[int, typer.Option("--decimals", min=0, max=12, help="Decimals shown in tables (JSON always keeps full precision). Example: --decimals 6")]


def json_inputs(include: bool, out: Output) -> bool:
    """--include-inputs, which adds to the JSON of --format json."""
    if include and out.format != Format.json:
        raise MhaError("include_inputs goes with --format json", quantity="include_inputs")
    return include


MaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", min=1, help="With --model: raise the token guard (MiniLM 512, its own limit; SmolLM2 256: every view keeps all heads' T × T weights). Example: --max-tokens 600")]
MaxSecondsOpt = Annotated[float | None, typer.Option("--max-seconds", min=0.001, help="Raise the time guard: go on with work estimated longer than this on 2 cores (ablate --rank stops at 30 s, the cache lab at 600 s). Example: --max-seconds 900", metavar="SECONDS")]
ModuleDModelOpt = Annotated[int | None, typer.Option("--d-model", "-d", help="With --module: the width to build it with (default 64). Example: --d-model 64")]

# the options of a run's source, by group; a command names the groups it takes (run_options)
RUN_GROUPS = {
    "config": [("config", ConfigOpt, None), ("mask", ConfigMaskOpt, None),
               ("pad", ConfigPadOpt, None), ("rope", RopeOpt, False),
               ("rope_base", ConfigRopeBaseOpt, None), ("window", WindowOpt, None)],
    "resplit": [("heads", ResplitOpt, None), ("kv_heads", KvHeadsOpt, None)],
    "config_name": [("config", ConfigOpt, None)],  # a config beside "sizes", whose flags it has
    "sizes": [("batch", BatchOpt, None), ("seq", SeqOpt, None), ("d_model", DModelOpt, None),
              ("heads", HeadsOpt, None), ("kv_heads", KvHeadsOpt, None),
              ("device", DeviceOpt, Device.cpu), ("dtype", DtypeOpt, Dtype.float32),
              ("mask", MaskOpt, None), ("pad", PadOpt, None), ("seed", SeedOpt, None),
              ("rope", RopeOpt, False), ("rope_base", RopeBaseOpt, None),
              ("window", WindowOpt, None), ("impl", ImplOpt, Impl.explicit)],
    "scoring": [("qk_norm", QkNormOpt, False), ("alibi", AlibiOpt, False), ("softcap", SoftcapOpt, None),
                ("sink_logits", SinkLogitsOpt, False), ("off_by_one", OffByOneOpt, False),
                ("diff", DiffOpt, False), ("relative_bias", RelativeBiasOpt, False)],
    "latent": [("latent", LatentOpt, None), ("rope_dim", RopeDimOpt, None), ("absorbed", AbsorbedOpt, False)],
    "module": [("module", ModuleOpt, None), ("init", InitOpt, None)],
    "module_width": [("d_model", ModuleDModelOpt, None)],
    "model": [("model", PretrainedOpt, None), ("sentence", SentenceOpt, None),
              ("max_tokens", MaxTokensOpt, None), ("checkpoint", CheckpointOpt, None),
              ("at_step", AtStepOpt, None)],
    "layer": [("layer", LayerOpt, None)],
    "audio": [("audio", AudioOpt, None), ("attention", AttentionOpt, None)],
    "time": [("max_seconds", MaxSecondsOpt, None)],
    "device": [("device", ComputeDeviceOpt, Device.cpu)],
}


def run_options(*groups: str):
    """Give a command the options of these groups of RUN_GROUPS, declared there once, before
    its own; the command receives them as one `o: RunOptions` (choices as their plain values)."""
    names = [name for g in groups for name, _, _ in RUN_GROUPS[g]]

    def wrap(command):
        sig = inspect.signature(command)
        own = [p for p in sig.parameters.values() if p.name != "o"]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                   annotation=annotation)
                 for g in groups for name, annotation, default in RUN_GROUPS[g]]

        @functools.wraps(command)
        def run(**kwargs):
            from mha_trace.runs.resolve import RunOptions, check_options, with_checkpoint

            given = {name: getattr(v, "value", v) for name in names
                     if (v := kwargs.pop(name)) is not None}
            o = with_checkpoint(RunOptions(**given))
            check_options(o)
            return command(o=o, **kwargs)

        run.__signature__ = sig.replace(parameters=added + [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own])
        run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}
        return run

    return wrap


_OUTPUT = ["format", "no_color", "width", "svg", "html"]


def _inputs(kwargs: dict) -> list:
    """The files a command reads (its config, the user's module, a text, a file of sentences, a
    checkpoint): outputs never overwrite them."""
    from mha_trace.runs.config import bundled_dir

    found = [kwargs[name] for name in ("text", "sentences") if kwargs.get(name)]
    if kwargs.get("config"):
        name = kwargs["config"]
        found += [name, str(bundled_dir() / f"{name.removesuffix('.toml')}.toml")]
    if kwargs.get("module"):
        found.append(kwargs["module"].rsplit(":", 1)[0])
    if kwargs.get("checkpoint"):  # run.pt, or run.pt@428 for a saved step
        found += [kwargs["checkpoint"], kwargs["checkpoint"].rpartition("@")[0]]
    return found


def output_options(png: bool | Callable[[dict], str | None] = False, step: bool = False,
                   scale: bool = True):
    """Give a command the output options (--format, --no-color, --width, --svg, --html, [--png])
    and --debug, declared here once; the command receives them as one `out: Output`. png:
    True, or a function of the command's options that gives the one line refusing --png where
    the view they ask for has no slide (None where it has one): refused before anything runs.
    """
    if not (isinstance(png, bool) or callable(png)):
        raise TypeError(f"png is True, False or a function of the options, not {png!r}")

    def wrap(command):
        from mha_trace.cli.app import _title

        sig = inspect.signature(command)
        own = [p for p in sig.parameters.values() if p.name != "out"]
        files = _file_options(command.__name__)
        extra = [("format", FormatOpt, Format.table), ("no_color", NoColorOpt, False),
                 ("width", WidthOpt, None), *files[:2], *files[2:] * bool(png),
                 *[("scale", ScaleOpt, None)] * bool(png and scale),
                 ("theme", ThemeOpt, Theme.dark), *[("step", StepOpt, False)] * step,
                 ("debug", DebugOpt, False)]
        added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                   annotation=annotation) for name, annotation, default in extra]

        @functools.wraps(command)
        def run(**kwargs):
            kwargs.pop("debug")  # read from argv before parsing, wherever it stands
            out = Output(*(kwargs.pop(name) for name in _OUTPUT), title=_title(),
                         png=kwargs.pop("png", None), theme=kwargs.pop("theme").value,
                         step=kwargs.pop("step", False), scale=kwargs.pop("scale", None))
            if out.scale is not None and not 0 < out.scale < float("inf"):
                raise MhaError(f"{out.scale} is not a weight above 0 (try --scale 1)",
                               quantity="scale")
            if out.png and callable(png) and (refused := png(kwargs)):
                raise MhaError(refused, quantity="png")
            if out.scale is not None and not out.png:
                raise MhaError("--scale sets the colour scale of --png FILE", quantity="scale")
            check_outputs({"svg": out.svg, "html": out.html, "png": out.png,
                           "save": kwargs.get("save_to")}, _inputs(kwargs))
            return command(out=out, **kwargs)

        run.__signature__ = sig.replace(parameters=[
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own] + added)
        run.__annotations__ = {p.name: p.annotation for p in run.__signature__.parameters.values()}
        return run

    return wrap
