"""One way in: every source of a run becomes one `Run`, with every check in one place.

    resolve(RunOptions())                                   the chapter's config ("The cat sat on mat")
    resolve(RunOptions(d_model=512, heads=8), "sizes")      the built-in module on random input
    resolve(RunOptions(config="chicken-road", heads=4))     a config, re-split into 4 heads
    resolve(RunOptions(module="my_mha.py:MHA", config=...)) the user's class on a config's tokens
    resolve(RunOptions(model="minilm", sentence="...", layer=4))  a real model's layer 4

The command line, the explorer's session and the Python API all call `resolve`; nothing else
builds a run. Options left at None take the source's own value, else the L04 table's default;
a source that fixes an option (a model fixes its sizes) refuses it instead of ignoring it."""

import functools
import os
from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mha_trace.runs.config import Config

from mha_trace.errors import MhaError
from mha_trace.runs.model_options import check_layer, check_picks_early, needs_model, refuse_with_model

DEFAULT_SENTENCE = "The animal didn't cross the street because it was too tired."
SIZE_DEFAULTS: dict[str, Any] = {"batch": 2, "seq": 10, "d_model": 512, "heads": 8, "mask": "none", "pad": 0,
                 "dtype": "float32", "device": "cpu", "seed": 0, "rope_base": 10000.0,
                 "impl": "explicit"}


@dataclass(frozen=True)
class RunOptions:
    """What decides a run: its source and its options (None: the source's own, or the default)."""

    # the source: sizes (none of these), a config, the user's module, or a pretrained model
    config: "str | Config | None" = None  # a config.Config (imported when used) or its name
    module: str | None = None  # FILE.py:Class, package.module:Class or example:NAME
    init: str | None = None  # the module's constructor arguments, "name=value, ..."
    model: str | None = None  # "minilm" | "smollm2" | "run.pt@STEP" (a run of mha-trace train)
    checkpoint: str | None = None  # a run of mha-trace train (made the model by with_checkpoint)
    at_step: int | None = None  # ... at this saved step (default: its last)
    sentence: str | None = None  # the model's text (default: DEFAULT_SENTENCE)
    audio: str | None = None  # what a model that hears (whisper) hears: a WAV file
    attention: str | None = None  # with audio: "cross" (the text looks at the sound) or "self"
    layer: int | None = None  # the model's layer, from 1
    max_tokens: int | None = None  # a model's token guard, raised (models.check_tokens)
    max_seconds: float | None = None  # a model's time guard, raised (ablate --rank, the cache lab)
    # sizes and options
    batch: int | None = None
    seq: int | None = None
    d_model: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    mask: str | None = None  # "none" | "causal"
    pad: int | None = None
    dtype: str | None = None
    device: str | None = None
    seed: int | None = None
    rope: bool = False
    rope_base: float | None = None
    window: int | None = None
    impl: str | None = None  # "explicit" | "sdpa" | "tiled"
    block_q: int | None = None  # impl "tiled": rows of a query tile (default: half of them)
    block_k: int | None = None  # ... and of a key/value tile
    decode: int = 0
    qk_norm: bool = False  # the scores' variants (core.scoring): QK-norm, soft-capping, sinks
    softcap: float | None = None
    sink_logits: bool = False
    off_by_one: bool = False
    alibi: bool = False
    diff: bool = False
    relative_bias: bool = False  # T5's relative position bias (core.scoring)
    latent: int | None = None  # multi-head latent attention (DeepSeek's): d_c, the latent K and V come from
    rope_dim: int | None = None  # ... d_R, its decoupled RoPE part (default d_k / 2)
    absorbed: bool = False  # ... computed the inference way, W_UK and W_UV folded in

    def scoring(self):
        """The scores' variant these options ask for (core.scoring.Scoring), checked."""
        from mha_trace.core.scoring import scoring_of

        return scoring_of(self.qk_norm, self.softcap, self.sink_logits, self.off_by_one,
                          getattr(self.impl, "value", self.impl), self.alibi, self.diff, self.window,
                          self.decode, self.relative_bias)

    def given(self, *names: str) -> dict:
        """The named options that were set (not None, False or 0)."""
        return {n: getattr(self, n) for n in names if getattr(self, n) not in (None, False, 0)}


from mha_trace.core.costs import DTYPE_BYTES  # noqa: E402 (no torch: the dtypes by name)

# each option's values, declared once: the command line's choices and the API's checks read them
CHOICES = {"attention": ("cross", "self", "encoder"), "mask": ("none", "causal"), "impl": ("explicit", "sdpa", "tiled"), "dtype": tuple(DTYPE_BYTES),
           "device": ("cpu", "cuda", "mps", "meta")}


def resolve(o: RunOptions, default: str = "config", alive: int = 1,
            hint: str = "use --device meta to trace the shapes without allocating"):
    """The Run these options describe. `default` is the source when none is named: "config" (the
    chapter's, as heads and explain use) or "sizes" (the built-in module, as shapes uses).
    `alive`: how many copies of a sized run live together (verify's references), and `hint` what
    the memory guard suggests when they would not fit."""
    config = check_early(o, default)
    if o.model:
        return _model_run(o)
    if o.module:
        return _module_run(o, on_config=o.config is not None or default == "config")
    if o.config is not None or default == "config":
        from mha_trace.runs.run import from_config

        return from_config(config, o.dtype or "float64", o.device or "cpu")
    return _sizes_run(o, alive, hint)


def _fixed_by_config(o: RunOptions) -> None:
    """A config fixes its tokens, their vectors and the module: these options would be ignored."""
    clash = [f"--{n.replace('_', '-')}" for n in o.given("batch", "seq", "seed", "decode")]
    if o.impl not in (None, "explicit"):
        clash.append("--impl")
    if clash:
        raise MhaError(f"{', '.join(clash)} {'does' if len(clash) == 1 else 'do'} not go with "
                       f"--config (a config fixes its tokens, their Q, K, V and the module)")


def with_checkpoint(o: RunOptions) -> RunOptions:
    """--checkpoint run.pt [--at-step N] is a model like the pretrained ones: "run.pt@N"."""
    if o.at_step is not None and o.checkpoint is None:
        raise MhaError("--at-step picks a saved step of --checkpoint run.pt", quantity="at_step")
    if o.checkpoint is None:
        return o
    if o.model is not None:
        raise MhaError("--model and --checkpoint are two models: choose one", quantity="checkpoint")
    if not o.checkpoint.endswith(".pt"):
        from mha_trace.errors import printable

        raise MhaError(f"{printable(o.checkpoint)} is not a run saved by mha-trace train (a .pt "
                       f"file, e.g. --checkpoint run.pt)", quantity="checkpoint")
    from dataclasses import replace

    step = "" if o.at_step is None else f"@{o.at_step}"
    return replace(o, model=o.checkpoint + step, checkpoint=None, at_step=None)


def check_options(o: RunOptions) -> None:
    """Each option of the right kind, each fixed choice one of its values (the CLI's parser
    already makes sure; the Python API gets the same words)."""
    for name, allowed in CHOICES.items():
        value = getattr(o, name)
        value = getattr(value, "value", value)  # a str enum
        if value is not None and value not in allowed:
            raise MhaError(f"{name} {value!r} is not one of {', '.join(allowed)}", quantity=name)
    for name in ("batch", "seq", "d_model", "heads", "kv_heads", "pad", "seed", "layer",
                 "window", "decode", "max_tokens", "at_step", "block_q", "block_k", "latent", "rope_dim"):
        value = getattr(o, name)
        if value is not None and (type(value) is not int):
            raise MhaError(f"{name} must be a whole number, got {value!r}", quantity=name)
    from mha_trace.core.validate import check_tiles

    seq = o.seq if isinstance(o.seq, int) and o.seq > 0 else SIZE_DEFAULTS["seq"]
    check_tiles(getattr(o.impl, "value", o.impl), seq, o.block_q, o.block_k)
    if o.max_tokens is not None and o.max_tokens < 1:
        raise MhaError(f"max_tokens={o.max_tokens} is not a number of tokens (at least 1)",
                       quantity="max_tokens")
    if o.max_seconds is not None and (not isinstance(o.max_seconds, (int, float))
                                      or isinstance(o.max_seconds, bool) or not o.max_seconds > 0):
        raise MhaError(f"max_seconds={o.max_seconds!r} is not a number of seconds (above 0)",
                       quantity="max_seconds")
    o.scoring()
    from mha_trace.core.latent import check_latent

    check_latent(o)
    if o.rope_base is not None and not isinstance(o.rope_base, (int, float)):
        raise MhaError(f"rope_base must be a number, got {o.rope_base!r}", quantity="rope_base")
    for name in ("model", "sentence", "init"):
        value = getattr(o, name)
        if value is not None and not isinstance(value, str):
            raise MhaError(f"{name} must be a str, got {type(value).__name__}", quantity=name)
    from mha_trace.models.guards import check_hearing, check_name

    if o.model is not None:
        check_name(o.model)
    check_hearing(o.model, o.audio, o.attention)
    from mha_trace.runs.config import Config

    if o.config is not None and not isinstance(o.config, (str, Config, os.PathLike)):
        raise MhaError(f"config must be a bundled name, a path or a Config, got "
                       f"{type(o.config).__name__}", quantity="config")


def check_early(o: RunOptions, default: str = "config"):
    """What `resolve` checks first, before torch is imported: the options, and for a config or
    sizes from flags, the config and the sizes (a wrong flag is refused in a fraction of the time
    torch takes to import). A model or a checkpoint is checked as it loads, a module's sizes as
    it is built. Returns the config when the run is a config's (its heads and tokens known, so a
    command checks its picks against them before torch too), else None."""
    from mha_trace.core.validate import check_sizes

    check_options(o)
    if o.model:
        return check_picks_early(o.model, o.layer, None)  # its declared sizes; the rest as it loads
    if o.checkpoint is not None:
        return None
    needs_model(o.sentence, o.layer, max_tokens=o.max_tokens, max_seconds=o.max_seconds)
    if o.config is not None:
        _fixed_by_config(o)
    if o.module:
        return None
    if o.config is not None or default == "config":
        if o.d_model is not None:  # --d-model sizes a user's module built on a config
            raise MhaError("d_model goes with --module (a config's width is fixed by the config)",
                           quantity="d_model")
        return config_of(o)
    pick = lambda name: SIZE_DEFAULTS[name] if getattr(o, name) is None else getattr(o, name)
    check_sizes(pick("batch"), pick("seq"), pick("d_model"), pick("heads"), o.kv_heads, pick("pad"))
    return None


def sizes_of(o: RunOptions):
    """The Sizes of a run from flags: every option given, the rest the L04 table's."""
    from mha_trace.runs.run import Sizes

    pick = {f.name: getattr(o, f.name) for f in fields(Sizes) if hasattr(o, f.name)}
    values = {name: SIZE_DEFAULTS.get(name) if value is None else value
              for name, value in pick.items()}
    values["scoring"] = o.scoring()
    if o.window is not None or o.decode:
        values["mask"] = "causal"  # a window or decoding implies causal
    return Sizes(**values)


def config_of(o: RunOptions):
    """The config named (or the chapter's), with the options given applied and checked."""
    from mha_trace.runs.config import Config, load_config

    c = o.config if isinstance(o.config, Config) else load_config(
        None if o.config is None else os.fspath(o.config))
    scoring = o.scoring()
    overrides = (o.heads, o.kv_heads, o.mask, o.pad, o.rope or None, o.rope_base, o.window,
                 None if scoring.plain else scoring, o.latent, o.rope_dim, o.absorbed or None)
    return c.with_overrides(*overrides) if any(v is not None for v in overrides) else c


def _sizes_run(o: RunOptions, alive: int, hint: str):
    from mha_trace.runs.run import from_sizes

    return from_sizes(sizes_of(o), guard_runs=alive, hint=hint)


def resolve_splits(o: RunOptions, head_counts: list) -> list:
    """The config's run split into each head count (compare): the same Q, K, V (or seed)."""
    from mha_trace.core.validate import divisors

    if not head_counts:
        raise MhaError("--heads needs a comma-separated list of head counts, e.g. 1,2,4")
    check_options(o)
    config = config_of(o)
    bad = [h for h in head_counts if h < 1 or config.d_model % h]
    if bad:
        verb = "does" if len(bad) == 1 else "do"
        raise MhaError(f"heads {', '.join(map(str, bad))} {verb} not divide d_model="
                       f"{config.d_model} (valid head counts: "
                       f"{', '.join(map(str, divisors(config.d_model)))})", quantity="heads")
    from mha_trace.runs.run import from_config  # torch, once the counts are checked

    runs = []
    for h in head_counts:
        base = config
        if config.kv_heads and h % config.kv_heads:  # GQA grouping that does not fit h: plain MHA
            base = replace(config, kv_heads=None)
        runs.append(from_config(base.with_overrides(heads=h), device=o.device or "cpu"))
    return runs


def symbols_probe(sizes):
    """The run that names each dim of a trace by its role: the same module on the meta device with
    distinct prime sizes, so every dimension's role shows by its value (shapes --compact)."""
    from mha_trace.runs.run import from_sizes

    kv = None if not sizes.kv_heads or sizes.kv_heads == sizes.heads else 3
    return from_sizes(replace(sizes, batch=2, seq=11, d_model=6 * 14, heads=6, kv_heads=kv,
                              device="meta", pad=0, decode=0))


def _module_run(o: RunOptions, on_config: bool):
    from mha_trace.runs.run import from_module, module_sizes_for_config

    if o.given("rope", "window", "decode", "kv_heads", "latent") or o.impl not in (None, "explicit") \
            or not o.scoring().plain:
        raise MhaError("--rope, --window, --impl, --decode, --kv-heads and the scores' variants "
                       "(--qk-norm, --alibi, --softcap, --sink-logits, --off-by-one, --diff) set up the built-in "
                       "module; your class decides its own", quantity="module")
    module = _module_of(o)
    if not on_config:
        return from_module(module, sizes_of(o), o.init)
    c = config_of(replace(o, heads=None))
    return from_module(module, module_sizes_for_config(c, o.d_model, o.heads, o.device or "cpu"), o.init,
                       tokens=c.tokens, config=c)


def _model_run(o: RunOptions):
    """One layer of a pretrained model on its sentence (decoding: on the greedy continuation)."""
    from mha_trace.models.registry import entry
    from mha_trace.runs.run import MAX_DECODE, from_model, from_model_decode

    refuse_with_model(**o.given("config", "module", "init", "batch", "seq", "d_model", "heads",
                                "kv_heads", "mask", "pad", "rope", "rope_base", "window", "qk_norm",
                                "softcap", "sink_logits", "off_by_one", "alibi", "diff", "relative_bias", "latent"))
    if entry(_model_of(o)).audio and o.attention != "self":  # its cross-attention while it writes
        from mha_trace.runs.heard import hearing_run

        return hearing_run(o, load(o))

    if o.decode and not 1 <= o.decode <= MAX_DECODE:
        raise MhaError(f"decode={o.decode} must be from 1 to {MAX_DECODE} (every step is a block "
                       f"of rows)", quantity="decode")
    if o.decode:
        m = load(o)
        if not m.capabilities.causal:
            raise MhaError(f"decode needs a causal model; {m.name} is an encoder (try --model "
                           f"smollm2)", quantity="decode")
        check_layer(m, 1 if o.layer is None else o.layer)
        text = DEFAULT_SENTENCE if o.sentence is None else o.sentence
        from mha_trace.models.guards import check_tokens

        check_tokens(m, len(m.tokenize(text)) + o.decode)  # the prompt and every token decoded
        ids = m.tokenize(text)
        _, generated = m.generate(ids, o.decode)  # greedy tokens: what real decoding feeds back
        labels = tuple(m.token_text(i) for i in ids + generated)
        return from_model_decode(m, ids + generated, len(ids), 1 if o.layer is None else o.layer, labels)
    s = encode(o)
    return from_model(s, check_layer(s.model, 1 if o.layer is None else o.layer))


def _module_of(o: RunOptions) -> str:
    if not o.module:
        raise MhaError("name your class: --module FILE.py:Class", quantity="module")
    return o.module


def _model_of(o: RunOptions) -> str:
    if not o.model:
        raise MhaError("name a model, e.g. --model minilm", quantity="model")
    return o.model


def load(o: RunOptions):
    """The model `o.model` names, on `o.device`, carrying this call's limits (--max-tokens,
    --max-seconds): the one place a model is loaded."""
    from mha_trace.models import load_model
    from mha_trace.models.base import Limits

    check_options(o)
    model = load_model(_model_of(o), o.device or "cpu", Limits(o.max_tokens, o.max_seconds))
    if o.attention == "self":  # its decoder over what it wrote, as a text model
        return model.reading(model.heard_file(o.audio))
    return model


def encode(o: RunOptions):
    """`o.sentence` (default: the model's own text, else DEFAULT_SENTENCE) through the whole
    model `o.model`; the last few sentences are kept, so views of one sentence run it once."""
    loaded = load(o)
    text = (loaded.default_text or DEFAULT_SENTENCE) if o.sentence is None else o.sentence
    return _encoded(loaded, loaded.device, text)


@functools.lru_cache(maxsize=4)
def _encoded(model, device, text: str):
    """Kept by model view (it carries its call's limits: a text a raised limit let through is
    never handed to a call whose own limit refuses it)."""
    return model.encode(text)
