"""Per-head weights, ablation and head-count comparison (one token's walk: `analyses.walk`). Plain data.

The numbers come from attention.MultiHeadAttention itself, run as `resolve` sets it up
(float64; for an explicit config the projections are identities, so heads are column slices of Q,
K, V), or from the user's module. The records are plain data; `mha_trace.render` finds each one's
renderer by its type.
"""

from dataclasses import dataclass, replace

import numpy as np
import torch

from mha_trace.models.base import ModelText
from mha_trace.runs.config import Config
from mha_trace.errors import MhaError
from mha_trace.analyses.ablated import Ablation
from mha_trace.analyses.latent_heads import LatentParts
from mha_trace.records import Shows
from mha_trace.runs.run import Run, check_finite


@dataclass
class Heads(Shows):
    """Every head's weights of one run: the one record `heads`, `explain`, `ablate`, `compare`,
    the explorer and the API read. Its source is its type: `LectureHeads` (the lecture's module,
    on a config, sizes or a model's layer), `ModuleHeads` (the user's module: only what its
    forward returned), `ModelHeads` (every layer of a pretrained model)."""

    tokens: tuple
    layers: np.ndarray  # (layers, heads, T, T): a config's or a module's run has one layer
    mask: np.ndarray | None  # (T, T) bool, True where a query may look; None when unmasked
    output: np.ndarray | None = None  # (T, D) the layer's output (None for a whole model)
    picked: list | None = None  # [(layer, head)] from 1 to show; None: every head
    effect: np.ndarray | None = None  # like `layers`: the effect weights, when asked for

    @property
    def weights(self) -> np.ndarray:
        """(heads, T, T) when the run has one layer; every layer's (layers, heads, T, T) else."""
        return self.layers[0] if len(self.layers) == 1 else self.layers

    @property
    def heads(self) -> int:
        return self.layers.shape[1]

    @property
    def kv_heads(self) -> int:
        return self.heads

    @property
    def distinct_rows(self) -> list[int]:
        """Per head of a one-layer run, how many of its weight rows differ (at 4 decimals)."""
        return [len({tuple(np.round(row, 4)) for row in w}) for w in self.weights]

    @property
    def whole(self) -> bool:
        """A model's overview: neither a layer nor a head was named."""
        return False

    @property
    def only(self) -> int | None:
        """The head (from 1) of a one-layer run shown alone, if one was picked."""
        return self.picked[0][1] if self.picked and len(self.picked) == 1 else None

    def kv_head_of(self, h: int) -> int:
        """The K/V head that query head h (0-based) reads under grouped-query attention."""
        return h // (self.heads // self.kv_heads)


@dataclass(kw_only=True)
class LectureHeads(Heads):
    """The lecture's module: the weights and every matrix between input and output."""


    config: Config  # what ran
    x: np.ndarray | None = None  # (T, D) generated embeddings; None for explicit Q, K, V
    q: np.ndarray  # (T, D) projected queries
    k: np.ndarray  # (T, G·d_k) projected keys
    v: np.ndarray  # (T, G·d_k) projected values
    concat: np.ndarray  # (T, D): the heads' outputs side by side, before W_O
    W_O: np.ndarray  # (D, D), output = concat @ W_O + b_O
    b_O: np.ndarray | None = None  # (D,) the output projection's bias (configs have none)
    layer: int = 0  # a model's run: the layer it ran, from 1 (0: a config's or sizes' run)
    sink: np.ndarray | None = None  # (H,) each head's sink logit (config.scoring.sinks)
    bias: np.ndarray | None = None  # (H, T, T) what the module adds to the scaled scores (ALiBi's, T5's)
    lam: tuple | None = None  # differential attention's (λ, λ_init): the second map taken away λ times
    latent: LatentParts | None = None  # MLA: q and k as [content part; RoPE part] (analyses.latent_heads)

    @property
    def title(self) -> str:
        return self.config.title

    def head_name(self, h: int) -> str:
        """Head h (from 1) as every view names it: "3.1" (layer 3, head 1) in a model, "1" else."""
        return f"{self.layer}.{h}" if self.layer else str(h)

    def through(self, token: str, only: int | None, position: int | None = None) -> str:
        """A walk's title, the same in the terminal, on the page and on the slide: "The animal
        ...: the query 'it' through head 3.1" (or "every head of layer 3"; a config's "every
        head")."""
        heads = (f"head {self.head_name(only)}" if only else
                 f"every head of layer {self.layer}" if self.layer else "every head")
        at = "" if position is None else f" (position {position})"
        return f"{self.title}: the query '{token}'{at} through {heads}"

    @property
    def kv_heads(self) -> int:
        return self.config.kv_heads or self.heads

    @property
    def d_k(self) -> int:
        return self.config.d_k

    @property
    def wo_identity(self) -> bool:
        return bool(np.array_equal(self.W_O, np.eye(len(self.W_O))))


@dataclass(kw_only=True)
class ModuleHeads(Heads):
    """The user's module: only the weights (and output) its forward returned."""


    label: str  # its name, call and what it was fed
    call: str = ""
    how: str = ""
    averaged: bool = False  # it returned one (T, T) map averaged over its heads

    @property
    def title(self) -> str:
        return self.label or "attention"


@dataclass(kw_only=True)
class ModelHeads(Heads):
    """Every layer of a pretrained model on one sentence (`model_heads.model_heads`)."""


    sentence: ModelText  # the text and the card of the model it went through
    words: bool = False  # word pieces grouped into words
    hide_special: bool = False  # [CLS] and [SEP] left out

    @property
    def title(self) -> str:
        return f"{self.sentence.model.name}: \"{self.sentence.text}\""

    @property
    def kv_heads(self) -> int:
        return self.sentence.model.kv_heads or self.heads

    @property
    def whole(self) -> bool:
        return self.picked is None

    @property
    def tables_in_notebook(self) -> bool:
        """The overview shows in Jupyter as its interactive view alone (its text form is a
        braille grid that HTML cannot line up)."""
        return not self.whole


def analyse(run: Run) -> LectureHeads:
    """Every head's weights, the projections, the concatenation and the output of one run of
    the lecture's module (or of its MLA sibling)."""
    from mha_trace.core.runtime import needs_values

    needs_values(run.device.type, "showing the weights")
    module = run.module
    captured: dict = {}
    hook = module.W_o.register_forward_pre_hook(lambda _, args: captured.update(concat=args[0]))
    try:
        output, weights = run.forward()
        check_finite(output, weights)
    finally:
        hook.remove()
    (qp, kp, vp), extras = _projections(run)
    numpy = lambda t: t[0].double().cpu().numpy()
    return LectureHeads(
        run.config.tokens, numpy(weights)[None],
        None if run.mask is None else run.mask.cpu().numpy(), numpy(output), config=run.config,
        x=None if run.x is None else numpy(run.x), q=numpy(qp), k=numpy(kp), v=numpy(vp),
        concat=numpy(captured["concat"]), W_O=module.W_o.weight.detach().double().cpu().T.numpy(),
        b_O=None if module.W_o.bias is None else module.W_o.bias.detach().double().cpu().numpy(),
        layer=run.layer, **extras)


def _projections(run: Run) -> tuple:
    """((q, k, v) as forward scores and mixes them, what else the walk reads): QK-norm's and
    RoPE's q and k, the sinks, ALiBi's bias, differential attention's λ; MLA's parts."""
    module, (q, k, v) = run.module, run.qkv
    if run.sizes.latent is not None:
        from mha_trace.analyses.latent_heads import latent_projections

        *qkv, parts = latent_projections(module, q)
        return qkv, {"latent": parts}
    with torch.no_grad():
        qp, kp, vp = module.W_q(q), module.W_k(k), module.W_v(v)
        # the dot products use q and k as forward scores them: normalised, then rotated
        qp, kp = _as_scored(qp, module, "q_norm"), _as_scored(kp, module, "k_norm")
    return (qp, kp, vp), {
        "sink": None if module.sinks is None else module.sink.detach().double().cpu().numpy(),
        "bias": _position_bias(module, len(run.config.tokens)),
        "lam": (float(module.lam().detach()), module.lambda_init) if module.diff else None}


def run_heads(run: Run, head: int | None = None, effect: bool = False) -> Heads:
    """Every head's weights of a run of the lecture's module or of the user's; `head` (from 1,
    checked against the heads there are) is the one shown; `effect`: the effect weights too."""
    if effect and not run.builtin:
        raise MhaError(NO_EFFECT, quantity="effect")
    view = analyse(run) if run.builtin else module_heads(run)
    if effect:
        view = with_effect(view)
    if head is None:
        return view
    from mha_trace.core.picks import check_head

    check_head(head, view.heads, "this config has" if run.builtin else "the module returned")
    return replace(view, picked=[(1, head)])


NO_EFFECT = ("needs each head's value vectors and W_O, which a module of your own does not "
             "return; run it on a config or a --model")


def with_effect(view: Heads) -> LectureHeads:
    """The view with its effect weights: each weight times the length of what its value moves
    through W_O, renormalised (`core.effect`)."""
    from mha_trace.core.effect import effect_weights, value_norms

    if not isinstance(view, LectureHeads):
        raise MhaError(NO_EFFECT, quantity="effect")
    norms = value_norms(view.v, view.W_O, view.heads, view.kv_heads)
    return replace(view, effect=effect_weights(view.layers, norms[None]))


def _position_bias(module, T: int):
    """ALiBi's or T5's (H, T, T) bias as the module adds it, or None."""
    if module.relative_bias:
        with torch.no_grad():
            return module.position_bias(0, T, T).double().cpu().numpy()
    if not module.alibi:
        return None
    from mha_trace.core.attention import alibi_bias

    return alibi_bias(module.heads, 0, T, T, torch.float64, "cpu").numpy()


def _as_scored(t, module, norm: str):
    """(1, T, n·d_k) projections as forward scores them, head by head: QK-norm's RMSNorm (the
    module's `norm`), then RoPE's turn."""
    from mha_trace.core.attention import rope

    B, T, width = t.shape
    heads = t.view(B, T, width // module.d_k, module.d_k).transpose(1, 2)
    if module.qk_norm:
        heads = getattr(module, norm)(heads)
    if module.rope and module.diff:  # each half turns as a head of its own
        halves = heads.unflatten(-1, (2, -1)).transpose(2, 3)  # (B, n, 2, T, d_k/2)
        heads = rope(halves, 0, module.rope_base).transpose(2, 3).flatten(-2)
    elif module.rope:
        heads = rope(heads, 0, module.rope_base, module.rope_dims)
    return heads.transpose(1, 2).reshape(B, T, width)


def ablate_heads(run: Run, removed: list[int]) -> Ablation:
    """Run the module again with the given heads' contributions zeroed before W_O."""
    from mha_trace.core.ablation import heads_zeroed
    from mha_trace.core.picks import check_head

    for h in removed:
        check_head(h, run.sizes.heads)

    view = analyse(run)
    with heads_zeroed({run.module: [(None, h) for h in removed]}):
        output, _ = run.forward()
    return Ablation(view, view.tokens, [(1, h) for h in sorted(removed)], view.output,
                    output[0].cpu().numpy())


@dataclass
class Comparison(Shows):
    """The same input split into several head counts (one `Heads` each)."""

    views: list


def analyse_splits(runs: list) -> list[Heads]:
    """The same Q, K, V (or the same seed) split into each head count: one run each
    (`resolve.resolve_splits`)."""
    return [analyse(run) for run in runs]


def module_heads(run: Run) -> Heads:
    """Run the user's module (as `resolve` built it) and keep the weights it returns, per head."""
    from mha_trace.runs import usermodule
    from mha_trace.runs.returned import split_result
    from mha_trace.core.runtime import needs_values

    needs_values(run.device.type, "showing the weights")
    try:
        with usermodule.user_code(f"{run.label}: forward"):
            result = run.forward()
    except MhaError:
        raise
    except Exception as e:
        raise MhaError(f"{run.label}: forward raised {usermodule.explain_exception(e)} "
                       f"(mha-trace shapes --module shows where)", exit_code=1) from None
    x = run.args[0]
    output, weights = split_result(result, x)
    if output.dim() == 2:  # a module that squeezes the batch away (the chapter's does)
        output = output[None]
    if weights is None:
        raise MhaError(f"{run.label} returns no attention weights (only its output), so there is "
                       f"nothing for heads to show; mha-trace shapes --module still traces it",
                       exit_code=1)
    w = weights.detach().double().cpu().numpy()
    T = len(run.tokens)
    if w.shape[-2:] != (T, T):
        raise MhaError(f"{run.label} returned weights of shape {list(w.shape)}, expected "
                       f"(..., {T}, {T})", exit_code=1)
    w = w.reshape(-1, T, T) if w.ndim <= 3 else w[0]
    averaged = weights.dim() == 3 and weights.shape[0] == 1 and run.sizes.heads > 1
    out = output.detach().double().cpu().numpy().reshape(-1, T, output.shape[-1])[0]
    for what, values in (("attention weights", w), ("output", out)):
        if not np.isfinite(values).all():
            raise MhaError(f"{run.label} returned {what} that are not all numbers (NaN or inf): "
                           f"something in its forward divides by zero or overflows; verify --module "
                           f"shows the first step that goes wrong", exit_code=1)
    return ModuleHeads(run.tokens, w[None], None if run.mask is None else run.mask.cpu().numpy(),
                 out, label=run.label, call=run.call, how=run.how or "seeded embeddings, batch 1",
                 averaged=averaged)
