"""Per-head weights and one token's walk-through, computed from a config. Returns plain data.

The numbers come from attention.MultiHeadAttention itself, run in float64: for an explicit config
its projections are identities (so heads are column slices of Q, K, V) and W_o is W_O^T (or the
identity); for a generated config everything is drawn from the config's seed.
"""

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from mha_trace.attention import MultiHeadAttention
from mha_trace.config import Config
from mha_trace.errors import MhaError


@dataclass
class HeadsView:
    config: Config
    mask: np.ndarray | None  # (T, T) bool, True where a query may look; None when unmasked
    x: np.ndarray | None  # (T, D) generated embeddings; None for explicit Q, K, V
    q: np.ndarray  # (T, D) projected queries
    k: np.ndarray  # (T, G·d_k) projected keys
    v: np.ndarray  # (T, G·d_k) projected values
    weights: np.ndarray  # (H, T, T)
    concat: np.ndarray  # (T, D): the heads' outputs side by side, before W_O
    output: np.ndarray  # (T, D)
    W_O: np.ndarray  # (D, D), output = concat @ W_O (+ nothing: configs have no biases)

    @property
    def tokens(self):
        return self.config.tokens

    @property
    def heads(self) -> int:
        return self.config.heads

    @property
    def kv_heads(self) -> int:
        return self.config.kv_heads or self.config.heads

    @property
    def d_k(self) -> int:
        return self.config.d_k

    @property
    def wo_identity(self) -> bool:
        return bool(np.array_equal(self.W_O, np.eye(len(self.W_O))))

    def kv_head_of(self, h: int) -> int:
        """The K/V head that query head h (0-based) reads under grouped-query attention."""
        return h // (self.heads // self.kv_heads)


def config_mask(config: Config) -> torch.Tensor | None:
    T = len(config.tokens)
    if config.mask == "none" and config.pad == 0:
        return None
    keep = torch.ones(T, T, dtype=torch.bool)
    if config.mask == "causal":
        keep = keep.tril()
    if config.pad:
        keep[:, T - config.pad:] = False
    return keep


def build(config: Config):
    """(module, q, k, v, x) for a config; q, k, v are the inputs handed to forward, (1, T, D)."""
    D, H, G = config.d_model, config.heads, config.kv_heads or config.heads
    torch.manual_seed(config.seed)
    module = MultiHeadAttention(D, H, G, bias=False).double()
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
        return module, q, k, v, None
    x = torch.randn(1, len(config.tokens), D, dtype=torch.float64)
    return module, x, x, x, x


def analyse(config: Config) -> HeadsView:
    module, q, k, v, x = build(config)
    mask = config_mask(config)
    captured = {}
    hook = module.W_o.register_forward_pre_hook(lambda _, args: captured.update(concat=args[0]))
    try:
        with torch.no_grad():
            output, weights = module(q, k, v, mask=mask)
            qp, kp, vp = module.W_q(q), module.W_k(k), module.W_v(v)
    finally:
        hook.remove()
    return HeadsView(
        config=config, mask=None if mask is None else mask.numpy(),
        x=None if x is None else x[0].numpy(), q=qp[0].numpy(), k=kp[0].numpy(),
        v=vp[0].numpy(), weights=weights[0].numpy(), concat=captured["concat"][0].numpy(),
        output=output[0].numpy(), W_O=module.W_o.weight.detach().T.numpy())


def find_position(tokens, token: str | None, position: int | None) -> int:
    """The index of the token to explain; a repeated token needs --position."""
    if position is not None:
        if not 0 <= position < len(tokens):
            raise MhaError(f"--position {position} is out of range (positions 0 to "
                           f"{len(tokens) - 1}: {', '.join(tokens)})")
        if token is not None and tokens[position] != token:
            raise MhaError(f"--position {position} is '{tokens[position]}', not '{token}'")
        return position
    if token is None:
        return 0
    found = [i for i, t in enumerate(tokens) if t == token]
    if not found:
        raise MhaError(f"token '{token}' is not in the sentence (tokens: {', '.join(tokens)})")
    if len(found) > 1:
        raise MhaError(f"token '{token}' appears at positions {', '.join(map(str, found))} "
                       f"(pick one with --position)")
    return found[0]


@dataclass
class KeyTerm:
    token: str
    products: list  # [(q_d, k_d), ...] for d in the head's dims
    dot: float
    scaled: float
    masked: bool
    weight: float


@dataclass
class HeadWalk:
    head: int  # 1-based, as the chapter numbers them
    dims: tuple  # (start, end) of the head's columns in Q and the concatenation
    kv_head: int  # 1-based
    query: np.ndarray  # (d_k,)
    terms: list[KeyTerm]
    values: np.ndarray  # (T, d_k): the value rows this head mixes
    output: np.ndarray  # (d_k,)


@dataclass
class Walk:
    view: HeadsView
    position: int
    sqrt_dk: float
    heads: list[HeadWalk]
    concat: np.ndarray  # (D,)
    output: np.ndarray  # (D,)

    @property
    def token(self) -> str:
        return self.view.tokens[self.position]


def walk(view: HeadsView, position: int) -> Walk:
    """One token through every head, each number computed by hand (numpy, float64).

    The weights are then checked against the module's own: the walk-through must describe the
    computation that ran, not a parallel one.
    """
    d_k, i = view.d_k, position
    sqrt_dk = math.sqrt(d_k)
    heads = []
    for h in range(view.heads):
        g = view.kv_head_of(h)
        qs = view.q[i, h * d_k:(h + 1) * d_k]
        ks = view.k[:, g * d_k:(g + 1) * d_k]
        vs = view.v[:, g * d_k:(g + 1) * d_k]
        dots = ks @ qs
        scaled = dots / sqrt_dk
        allowed = np.ones(len(dots), bool) if view.mask is None else view.mask[i]
        weights = np.zeros_like(scaled)
        if allowed.any():
            e = np.exp(scaled[allowed] - scaled[allowed].max())
            weights[allowed] = e / e.sum()
        np.testing.assert_allclose(weights, view.weights[h, i], rtol=1e-9, atol=1e-12)
        terms = [KeyTerm(t, list(zip(qs.tolist(), ks[j].tolist())), float(dots[j]),
                         float(scaled[j]), not allowed[j], float(weights[j]))
                 for j, t in enumerate(view.tokens)]
        heads.append(HeadWalk(h + 1, (h * d_k, (h + 1) * d_k), g + 1, qs, terms, vs, weights @ vs))
    concat = np.concatenate([hw.output for hw in heads])
    return Walk(view, i, sqrt_dk, heads, concat, concat @ view.W_O)


@dataclass
class Ablation:
    view: HeadsView  # the full run
    removed: list[int]  # 1-based head numbers
    output: np.ndarray  # (T, D) with those heads' outputs zeroed before W_O
    per_token: np.ndarray  # (T,) L2 distance of each token's output from the full output
    total: float  # L2 norm of the whole difference
    relative: float  # total / L2 norm of the full output


def ablate(config: Config, removed: list[int]) -> Ablation:
    """Run the module again with the given heads' contributions zeroed before W_O."""
    view = analyse(config)
    for h in removed:
        if not 1 <= h <= config.heads:
            raise MhaError(f"--head {h} is out of range (this config has heads 1 to {config.heads})")
    module, q, k, v, _ = build(config)
    d_k = config.d_k

    def zero_heads(_, args):
        concat = args[0].clone()
        for h in removed:
            concat[..., (h - 1) * d_k:h * d_k] = 0.0
        return (concat,)

    hook = module.W_o.register_forward_pre_hook(zero_heads)
    try:
        with torch.no_grad():
            output, _ = module(q, k, v, mask=config_mask(config))
    finally:
        hook.remove()
    output = output[0].numpy()
    diff = output - view.output
    full_norm = float(np.linalg.norm(view.output))
    total = float(np.linalg.norm(diff))
    return Ablation(view, sorted(removed), output, np.linalg.norm(diff, axis=1), total,
                    total / full_norm if full_norm else float("nan"))


def compare(config: Config, head_counts: list[int]) -> list[HeadsView]:
    """The same Q, K, V (or the same seed) split into each head count."""
    if not head_counts:
        raise MhaError("--heads needs a comma-separated list of head counts, e.g. 1,2,4")
    bad = [h for h in head_counts if h < 1 or config.d_model % h]
    if bad:
        from mha_trace.validate import divisors

        verb = "does" if len(bad) == 1 else "do"
        raise MhaError(f"heads {', '.join(map(str, bad))} {verb} not divide d_model="
                       f"{config.d_model} (valid head counts: "
                       f"{', '.join(map(str, divisors(config.d_model)))})")
    views = []
    for h in head_counts:
        base = config
        if config.kv_heads and h % config.kv_heads:  # GQA grouping that does not fit h: plain MHA
            base = replace(config, kv_heads=None)
        views.append(analyse(base.with_overrides(heads=h)))
    return views


def distinct_rows(weights: np.ndarray, decimals: int = 4) -> int:
    return len({tuple(np.round(row, decimals)) for row in weights})


@dataclass
class ModuleHeads:
    """What the user's own module returned for a config's tokens."""

    label: str
    call: str
    tokens: tuple
    weights: np.ndarray  # (H, T, T), or (1, T, T) when the module averages over heads
    averaged: bool  # the module returned one (T, T) map per batch item
    output: np.ndarray  # (T, D)
    mask: np.ndarray | None


def module_heads(spec: str, init: str | None, config: Config, d_model: int, heads: int) -> ModuleHeads:
    """Run --module on the config's tokens (seeded embeddings of width d_model, batch 1)."""
    from mha_trace import usermodule

    torch.manual_seed(config.seed)
    module, _, label = usermodule.load(spec, d_model, heads, init, torch.device("cpu"), torch.float64)
    x = torch.randn(1, len(config.tokens), d_model, dtype=torch.float64)
    mask = config_mask(config)
    call, args, kwargs = usermodule.forward_call(module, x, mask)
    try:
        with torch.no_grad():
            result = module(*args, **kwargs)
    except Exception as e:
        raise MhaError(f"{label}: forward raised {type(e).__name__}: {str(e).splitlines()[0]} "
                       f"(mha-trace shapes --module shows where)", exit_code=1) from None
    output, weights = usermodule.split_result(result, x)
    if weights is None:
        raise MhaError(f"{label} returns no attention weights (only its output), so there is "
                       f"nothing for heads to show; mha-trace shapes --module still traces it",
                       exit_code=1)
    w = weights.detach().double().numpy()
    T = len(config.tokens)
    if w.shape[-2:] != (T, T):
        raise MhaError(f"{label} returned weights of shape {list(w.shape)}, expected (..., {T}, {T})",
                       exit_code=1)
    w = w.reshape(-1, T, T) if w.ndim <= 3 else w[0]
    averaged = weights.dim() == 3 and weights.shape[0] == 1 and heads > 1
    out = output.detach().double().numpy().reshape(-1, T, output.shape[-1])[0]
    return ModuleHeads(label, call, config.tokens, w, averaged, out,
                       None if mask is None else mask.numpy())
