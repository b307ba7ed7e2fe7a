"""One description of a run: the module, what forward is handed, the mask, the tokens, the sizes.

Every source of a run becomes a `Run`, and every command consumes one:

    from_sizes(Sizes(d_model=512, heads=8))     sizes from flags: the built-in module, random input
    from_config(load("cat-sat-on-mat"))         a TOML config: its Q, K, V (or seeded embeddings)
    from_module("my_mha.py:MHA", Sizes(...))    the user's own class, built and called by signature

The checks happen here, once, before anything is allocated: sizes (`validate`), the device and the
memory guard (`runtime`).
"""

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch
import torch.nn as nn

from mha_trace.core.attention import KVCache, MultiHeadAttention
from mha_trace.runs.config import Config
from mha_trace.core.costs import Dims
from mha_trace.core.scoring import Scoring
from mha_trace.errors import MhaError
from mha_trace.core.runtime import DTYPES, check_device, guard_memory, guard_time, seed
from mha_trace.core.validate import addressable, check_sizes, seed_fits

if TYPE_CHECKING:
    from mha_trace.models.sentence import Sentence


@dataclass(frozen=True)
class Sizes:
    """What the flags say: sizes, mask, device, dtype and seed (the defaults are the L04 table's)."""

    batch: int = 2
    seq: int = 10
    d_model: int = 512
    heads: int = 8
    kv_heads: int | None = None
    mask: str = "none"  # "none" | "causal"
    pad: int = 0  # the last `pad` keys are padding
    dtype: str = "float32"
    device: str = "cpu"
    seed: int = 0
    rope: bool = False  # rotary positions on Q and K
    rope_base: float = 10000.0
    window: int | None = None  # sliding window: a query sees at most this many keys (causal)
    impl: str = "explicit"  # "explicit" | "sdpa" (the fused kernel) | "tiled" (FlashAttention-2's loop)
    decode: int = 0  # after a prefill over `seq` tokens, this many one-token steps
    block_q: int | None = None  # impl "tiled": rows of a query tile (default: half of them)
    block_k: int | None = None  # ... and of a key/value tile
    cross: int | None = None  # a cross-attention: the encoder positions its keys and values come from
    scoring: Scoring = Scoring()  # QK-norm, soft-capping, sinks (core.scoring)
    latent: int | None = None  # multi-head latent attention: d_c (core.latent_attention)
    rope_dim: int | None = None  # ... d_R, its decoupled RoPE key (default d_k / 2)
    absorbed: bool = False  # ... W_UK and W_UV folded in, as inference runs it

    @property
    def modern(self) -> bool:
        """Any option past the textbook forward pass (their bytes are counted by a meta trace)."""
        return self.rope or self.window is not None or self.impl != "explicit" or self.decode > 0 \
            or not self.scoring.plain or self.latent is not None

    def module_options(self) -> dict:
        return {"rope": self.rope, "rope_base": self.rope_base, "rope_dims": self.rope_dim, "window": self.window,
                "impl": self.impl, "block_q": self.block_q, "block_k": self.block_k,
                **self.scoring.module_options()}

    def rope_setting(self) -> str:
        """RoPE as a title writes it: " rope", " rope rope_dim=4" (partial RoPE), "" without."""
        return (" rope" + (f" rope_dim={self.rope_dim}" if self.rope_dim else "")) if self.rope else ""

    def dims(self, bias: bool = True) -> Dims:
        return Dims(self.batch, self.seq, self.d_model, self.heads, self.kv_heads or self.heads,
                    self.dtype, bias=bias, mask=mask_kind(self.mask, self.pad, self.seq))


@dataclass(frozen=True)
class Run:
    """A module and exactly what its forward is handed; `module(*args, **kwargs)` is the run.
    Frozen: made by `resolve` (through the builders here), never changed after."""

    module: nn.Module
    args: tuple
    kwargs: dict
    sizes: Sizes
    label: str = ""  # "" for the built-in module, else "MultiHeadAttention from my_mha.py"
    call: str = "forward(q, k, v, mask)"
    mask: torch.Tensor | None = None  # (T, T) bool, True where a query may look
    tokens: tuple = ()  # one label per position (configs); () for random input
    x: torch.Tensor | None = None  # the embeddings, when they were drawn at random
    config: Config | None = None
    source: str = ""  # the file the trace attributes rows to (the module's own)
    estimate: int = 0  # bytes the memory guard estimated (0 when it could not tell)
    phases: list = field(default_factory=list)  # decoding: [(label, args, kwargs)] in order
    how: str = ""  # how a user's module was fed, when that needs saying
    sentence: "Sentence | None" = None  # a model's run: the text through the whole model (every layer)
    layer: int = 0  # a model's run: the layer it runs, from 1

    @property
    def builtin(self) -> bool:
        """The lecture's own module (MultiHeadAttention, or its MLA sibling)."""
        return type(self.module) is MultiHeadAttention or self.sizes.latent is not None

    @property
    def device(self) -> torch.device:
        return torch.device(self.sizes.device)

    @property
    def qkv(self) -> tuple:
        """(q, k, v) as forward receives them: forward(x) is self-attention, q = k = v = x."""
        return self.args * 3 if len(self.args) == 1 else self.args[:3]

    @property
    def numpy(self) -> bool:
        """The module is a NumPy implementation (a class with forward, not a torch module; a
        plain function is traced as torch code)."""
        return not isinstance(self.module, nn.Module) and hasattr(self.module, "forward")

    def forward(self):
        if self.numpy:
            return self.module.forward(*self.args, **self.kwargs)
        with torch.no_grad():
            return self.module(*self.args, **self.kwargs)


def check_finite(output, weights) -> None:
    """Refuse results that overflowed: NaN weights must never print under "rows sum to 1"."""
    for name, t in (("weights", weights), ("output", output)):
        if t is not None and t.device.type != "meta" and not torch.isfinite(t).all():
            raise MhaError(f"the attention {name} are not finite numbers (inf or NaN): the "
                           f"inputs are too large for {str(t.dtype).removeprefix('torch.')} "
                           f"(a dot product q·k overflows); scale them down")


def mask_kind(mask: str, pad: int, seq: int) -> str:
    """'none', 'pad' (one row expanded: T bytes) or 'full' (a (T, T) matrix)."""
    if mask == "causal":
        return "full"
    return "pad" if pad else "none"


def make_mask(seq: int, mask: str = "none", pad: int = 0, device=None,
              window: int | None = None) -> torch.Tensor | None:
    """(T, T) bool, True where query i may look at key j; None when nothing is masked.

    A padding-only mask is the same for every query: one row of T, expanded (no T·T copy).
    A sliding window of W lets query i see keys i - W + 1 .. i (causal, Mistral's convention).
    """
    from mha_trace.core import masks

    if not masks.is_masked(mask, pad, window):
        return None
    keep = torch.from_numpy(masks.allowed(seq, mask, pad, window))  # numpy: meta holds no values
    if mask == "none" and window is None:  # padding only: one row, expanded (no T·T copy)
        return keep[0].clone().to(device).expand(seq, seq)
    return keep.to(device)


def _device(sizes: Sizes) -> torch.device:
    return check_device(sizes.device)


MAX_DECODE = 1000


def check_modern(sizes: Sizes) -> None:
    from mha_trace.core.validate import positive, rope_pairs

    if sizes.rope:
        rope_pairs(sizes.d_model, sizes.heads, sizes.rope_dim)
    sizes.scoring.check_width(sizes.d_model // sizes.heads, sizes.rope)
    if not 1 < sizes.rope_base < 1e300:  # nan and inf included
        raise MhaError(f"rope_base={sizes.rope_base} must be a number more than 1 and below 1e300 "
                       f"(LLaMA uses 10000)",
                       quantity="rope_base")
    if sizes.window is not None:
        positive("window", sizes.window)
    if sizes.decode:
        positive("decode", sizes.decode)
        if sizes.decode > MAX_DECODE:
            raise MhaError(f"decode={sizes.decode} is more steps than a trace can show (at most "
                           f"{MAX_DECODE}; every step is a block of rows)", quantity="decode")
        if sizes.pad:
            raise MhaError("pad does not go with --decode (decoding appends real tokens)",
                           quantity="pad")


def from_sizes(sizes: Sizes, guard_runs: int = 1,
               hint: str = "use --device meta to trace the shapes without allocating") -> Run:
    """The built-in module at these sizes, on random input (meta: no values at all).

    With --decode, the input is `seq` prompt tokens and `decode` more, fed one at a time.
    """
    check_sizes(sizes.batch, sizes.seq, sizes.d_model, sizes.heads, sizes.kv_heads, sizes.pad)
    check_modern(sizes)
    seed_fits(sizes.seed)
    addressable(sizes.batch, sizes.heads, sizes.seq + sizes.decode, sizes.dims().itemsize)
    device = _device(sizes)
    need = _meta_estimate(sizes) if sizes.modern and device.type != "meta" else None
    estimate = guard_memory(sizes.dims(), device, runs=guard_runs, hint=hint, need=need)
    guard_time(sizes.dims(), device, sizes.impl or "explicit", runs=guard_runs)
    seed(sizes.seed)
    dtype, shape = DTYPES[sizes.dtype], (sizes.batch, sizes.seq, sizes.d_model)
    with torch.device(device):
        module = lecture_module(sizes).to(dtype)
        # meta tensors hold no values, so there is nothing to draw at random
        draw = torch.empty if device.type == "meta" else torch.randn
        x = draw(shape, dtype=dtype)
        steps = [draw((sizes.batch, 1, sizes.d_model), dtype=dtype) for _ in range(sizes.decode)]
        mask = make_mask(sizes.seq, "causal" if sizes.decode else sizes.mask, sizes.pad, device)
    kwargs = {} if mask is None else {"mask": mask}
    call = "forward(q)" if mask is None else "forward(q, mask)"
    phases = []
    if sizes.decode:
        cache = KVCache()
        phases = [("prefill", (x,), {**kwargs, "cache": cache})] + [
            (f"decode step {i + 1}", (t,), {"cache": cache}) for i, t in enumerate(steps)]
        call = "forward(q, mask, cache), then forward(token, cache) per step"
    return Run(module, (x,), kwargs, sizes, call=call, mask=mask, x=x, source=_source(module),
               estimate=estimate, phases=phases)


def lecture_module(sizes: Sizes) -> nn.Module:
    """The lecture's module these sizes describe: MultiHeadAttention, or with `latent` DeepSeek's MLA."""
    if sizes.latent is None:
        return MultiHeadAttention(sizes.d_model, sizes.heads, sizes.kv_heads, **sizes.module_options())
    from mha_trace.core.latent_attention import LatentAttention

    return LatentAttention(sizes.d_model, sizes.heads, sizes.latent, sizes.rope_dim or sizes.d_model // sizes.heads // 2,
                           rope_base=sizes.rope_base, absorbed=sizes.absorbed)


def _meta_estimate(sizes: Sizes) -> int:
    """Bytes the run allocates, counted by tracing the same run on the meta device (no memory):
    the estimate that fits each implementation (fused SDPA, RoPE, windows, decoding)."""
    from mha_trace.speedups import light_meta_kernels
    from mha_trace.core.tracer import trace_phases

    run = from_sizes(replace(sizes, device="meta"))
    with light_meta_kernels(run.device):
        steps = trace_phases(run.module, run.phases or [("", run.args, run.kwargs)],
                             watch=(run.source,)).steps
    params = sum(p.numel() for p in run.module.parameters()) * sizes.dims().itemsize
    return params + sum(s.bytes for s in steps)


def config_sizes(config: Config, dtype: str = "float64", device: str = "cpu") -> Sizes:
    return Sizes(batch=1, seq=len(config.tokens), d_model=config.d_model, heads=config.heads,
                 kv_heads=config.kv_heads, mask=config.mask, pad=config.pad, dtype=dtype,
                 device=device, seed=config.seed, latent=config.latent, rope_dim=config.rope_dim,
                 absorbed=config.absorbed)


def from_config(config: Config, dtype: str = "float64", device: str = "cpu") -> Run:
    """A config's run, in float64 by default: the numbers the chapter's tables print.

    Explicit Q, K, V: the projections are identities, so heads are column slices of Q, K, V, and
    W_o is the config's W_O (or the identity). Generated: everything drawn from the config's seed
    (with `latent`, the lecture's MLA module on the same embeddings).
    """
    rope, rope_base, window = config.rope, config.rope_base, config.window
    sizes = replace(config_sizes(config, dtype, device), rope=rope, rope_base=rope_base,
                    window=window, scoring=config.scoring)
    check_modern(sizes)
    dev = _device(sizes)
    estimate = guard_memory(sizes.dims(bias=False), dev, hint="use a config with fewer tokens "
                            "or a smaller d_model")
    D, H, G = config.d_model, config.heads, config.kv_heads or config.heads
    seed(config.seed)
    module = MultiHeadAttention(D, H, G, bias=False, rope=rope, rope_base=rope_base, window=window,
                                rope_dims=config.rope_dim, **config.scoring.module_options()) if config.latent is None else lecture_module(sizes)
    module, x = module.double(), None
    if config.explicit:
        eye = torch.eye(D, dtype=torch.float64)
        with torch.no_grad():
            module.W_q.weight.copy_(eye)
            # K/V heads are column slices too; under GQA the first G slices of K and V
            module.W_k.weight.copy_(eye[: G * config.d_k])
            module.W_v.weight.copy_(eye[: G * config.d_k])
            W_O = torch.tensor(config.W_O, dtype=torch.float64) if config.W_O else eye
            module.W_o.weight.copy_(W_O.T)  # nn.Linear computes x @ weight.T
        q, k, v = (torch.tensor(m, dtype=torch.float64)[None] for m in (config.Q, config.K, config.V))
    else:
        x = torch.randn(1, len(config.tokens), D, dtype=torch.float64)
        q = k = v = x
    dt = DTYPES[dtype]
    module = module.to(device=dev, dtype=dt)
    q, k, v = (t.to(device=dev, dtype=dt) for t in (q, k, v))
    mask = make_mask(len(config.tokens), config.mask, config.pad, dev, window)
    args, call = ((q, k, v), "forward(q, k, v, mask)") if config.latent is None else ((q,), "forward(x, mask)")
    return Run(module, args, {"mask": mask}, sizes, call=call, mask=mask, tokens=config.tokens,
               x=None if x is None else q, config=config, source=_source(module), estimate=estimate)


def from_module(spec: str, sizes: Sizes, init: str | None = None, tokens: tuple = (),
                config: Config | None = None) -> Run:
    """The user's own class (`FILE.py:Class`), built from the sizes and called by its signature."""
    from mha_trace.runs import usermodule

    check_sizes(sizes.batch, sizes.seq, sizes.d_model, None if init else sizes.heads, None,
                sizes.pad)
    seed_fits(sizes.seed)
    addressable(sizes.batch, sizes.heads, sizes.seq, sizes.dims().itemsize)
    device = _device(sizes)
    estimate = guard_memory(sizes.dims(), device)
    seed(sizes.seed)
    dtype, shape = DTYPES[sizes.dtype], (sizes.batch, sizes.seq, sizes.d_model)
    latent = () if sizes.latent is None else (sizes.latent, sizes.rope_dim or sizes.d_model // sizes.heads // 2)
    module, source, label = usermodule.load_user_class(spec, sizes.d_model, sizes.heads, init, device,
                                                       dtype, sizes.kv_heads, latent)
    with torch.device(device):
        x = torch.empty(shape, dtype=dtype) if device.type == "meta" else torch.randn(shape, dtype=dtype)
        mask = make_mask(sizes.seq, sizes.mask, sizes.pad, device)
    if not isinstance(module, nn.Module):  # a NumPy implementation: one float64 sequence
        if device.type != "cpu":
            raise MhaError(f"{label} is a NumPy implementation: it runs on the CPU",
                           quantity="device")
        sizes = replace(sizes, batch=1, dtype="float64")
        x = x[0].double().numpy()
        mask = None if mask is None else mask.numpy()
    call, args, kwargs = usermodule.forward_call(module, x, mask)
    run = Run(module, args, kwargs, sizes, label=label, call=call, mask=mask, tokens=tokens, x=x,
              config=config, source=source, estimate=estimate)
    if config is not None and config.explicit:
        return usermodule.feed_config(run, config)
    return run


def module_sizes_for_config(config: Config, d_model: int | None, heads: int | None,
                            device: str = "cpu") -> Sizes:
    """A user module on a config's tokens: batch 1, the config's length, mask and seed; the
    config's width and heads unless given (64 and 4 for a generated config)."""
    width = d_model or (config.d_model if config.explicit else 64)
    return replace(config_sizes(config, device=device), d_model=width,
                   heads=heads or config.heads, kv_heads=None)


def _source(module) -> str:
    from mha_trace.core.tracer import source_file

    return source_file(module) or "?"


def from_model(sentence, layer: int) -> Run:
    """One layer's self-attention of a pretrained model, on that layer's real input.

    sentence: `models.sentence.Sentence` (the text already through the whole model); layer from 1,
    checked by the resolver. A causal model's run carries its causal mask.
    """
    model = sentence.model
    module = model.attention_module(layer)
    x = model.attention_input(sentence.inputs, layer)
    T = x.size(1)
    origin = f"{model.name} layer {layer}"
    mask_kind = "causal" if model.capabilities.causal else "none"
    config = Config(model.name, "", sentence.text, "", sentence.labels, model.heads,
                    model.d_model, kv_heads=model.kv_heads, mask=mask_kind, origin=origin,
                    rope=module.rope, rope_base=module.rope_base)
    sizes = Sizes(batch=1, seq=T, d_model=model.d_model, heads=model.heads,
                  kv_heads=model.kv_heads, mask=mask_kind, device=model.device.type,
                  rope=module.rope, rope_base=module.rope_base)
    mask = make_mask(T, mask_kind, device=model.device)
    return Run(module, (x,), {} if mask is None else {"mask": mask}, sizes,
               label=f"{origin} attention", call="forward(x)" if mask is None else "forward(x, mask)",
               mask=mask, tokens=sentence.labels, x=x, config=config, source=_source(module),
               sentence=sentence, layer=layer)


def from_model_decode(model, ids: list, prompt: int, layer: int, labels: tuple) -> Run:
    """Real decoding through one layer's attention: its inputs for the prompt (the prefill) and
    then for each generated token, one at a time, into a KVCache (a causal model's layer input
    for a token does not depend on later tokens, so one full pass gives every step's input).
    The layer is checked by the resolver."""
    _, inputs, _ = model.run(ids)
    x = model.attention_input(inputs, layer)  # (1, T + N, D)
    module = model.attention_module(layer)
    steps = len(ids) - prompt
    sizes = Sizes(batch=1, seq=prompt, d_model=model.d_model, heads=model.heads,
                  kv_heads=model.kv_heads, mask="causal", device=model.device.type,
                  rope=module.rope, rope_base=module.rope_base, decode=steps)
    mask = make_mask(prompt, "causal", device=model.device)
    cache = KVCache()
    phases = [("prefill", (x[:, :prompt],), {"mask": mask, "cache": cache})] + [
        (f"decode step {i + 1}", (x[:, prompt + i:prompt + i + 1],), {"cache": cache})
        for i in range(steps)]
    return Run(module, (x[:, :prompt],), {"mask": mask}, sizes,
               label=f"{model.name} layer {layer} attention",
               call="forward(x, mask, cache), then forward(token, cache) per generated token",
               mask=mask, tokens=labels, x=x, source=_source(module), phases=phases, layer=layer)
