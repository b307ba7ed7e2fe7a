"""Is a student's own attention module right? Copy the reference weights into it, run both on the
same input and mask, compare, and when they differ, point at the first wrong step and say why.

The reference is the lecture's MultiHeadAttention (float64). The student's four projections are
found by name (W_q / query / q_proj ..., fused c_attn / qkv / in_proj) or, failing that, by shape,
or given with --map; the mapping used is always printed.
"""

import copy
import inspect
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from mha_trace.attention import MultiHeadAttention, rope
from mha_trace.errors import MhaError
from mha_trace.roles import first_wrong_step

NAMES = {  # lower-cased attribute names, most specific first
    "q": ("w_q", "wq", "q_proj", "query", "to_q", "q_linear", "linear_q", "q"),
    "k": ("w_k", "wk", "k_proj", "key", "to_k", "k_linear", "linear_k", "k"),
    "v": ("w_v", "wv", "v_proj", "value", "to_v", "v_linear", "linear_v", "v"),
    "o": ("w_o", "wo", "o_proj", "out_proj", "out", "to_out", "c_proj", "proj", "dense",
          "o_linear", "linear_out", "fc_out", "o"),
    "qkv": ("c_attn", "qkv", "w_qkv", "qkv_proj", "in_proj"),
}


@dataclass
class Mapping:
    """Which of the student's parameters holds which projection."""

    layers: dict  # role ("q", "k", "v", "o", "qkv") -> (name, nn.Linear or (weight, bias) pair)
    how: str  # "by name", "by shape", "--map"

    def describe(self) -> str:
        if not self.layers:
            return f"(projections {self.how})"
        return ", ".join(f"{role}={name}" for role, (name, _) in self.layers.items()) + f" ({self.how})"


def _linears(module: nn.Module) -> dict:
    return {name: m for name, m in module.named_modules() if isinstance(m, nn.Linear)}


def _weights(module) -> dict:
    """Where a projection can live: each nn.Linear, each 2-D parameter or buffer outside one
    (used as x @ W or x @ W.T), and on a NumPy class each 2-D array attribute."""
    if not isinstance(module, nn.Module):
        return {n: v for n, v in vars(module).items() if isinstance(v, np.ndarray) and v.ndim == 2}
    found = _linears(module)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if t.dim() == 2 and name.rpartition(".")[0] not in found:
            found[name] = t
    return _per_head(found)


def _per_head(weights: dict) -> dict:
    """Per-head projections (a ModuleList of nn.Linear(d_model, d_k), or of head modules each
    holding its own query, key and value) gathered into one list each, named with * for the
    head: "heads.*.query" holds heads.0.query, heads.1.query, ..."""
    lists = {}
    for name, held in weights.items():
        if isinstance(held, nn.Linear) and any(p.isdigit() for p in name.split(".")):
            lists.setdefault(".".join("*" if p.isdigit() else p for p in name.split(".")), []) \
                .append(name)
    grouped = {n for names in lists.values() if len(names) > 1 for n in names}
    found = {n: h for n, h in weights.items() if n not in grouped}
    return found | {key: [weights[n] for n in names] for key, names in lists.items()
                    if len(names) > 1}


def _shape(holder) -> tuple:
    if isinstance(holder, list):  # per-head projections, stacked as one
        return sum(_shape(h)[0] for h in holder), _shape(holder[0])[1]
    return tuple(_weight(holder).shape) if isinstance(holder, (nn.Linear, tuple)) else tuple(holder.shape)


def _found(weights: dict) -> str:
    return ", ".join(f"{n} {list(_shape(h))}" for n, h in weights.items()) or "none"


def find_projections(module, d_model: int, given: str | None = None) -> Mapping:
    """The student's Q, K, V and output projections: by --map, by name, or by shape."""
    if isinstance(module, nn.MultiheadAttention):
        pair = (module.in_proj_weight, module.in_proj_bias)
        return Mapping({"qkv": ("in_proj_weight", pair), "o": ("out_proj", module.out_proj)}, "by name")
    weights = _weights(module)
    if given:
        roles = {}
        for part in given.split(","):
            role, _, name = part.strip().partition("=")
            if role not in NAMES or name not in weights:
                raise MhaError(f"'{part.strip()}' is not ROLE=NAME with ROLE q, k, v, o or qkv and "
                               f"NAME one of your weights (found: {_found(weights)})", quantity="map")
            roles[role] = (name, weights[name])
        return _checked(Mapping(roles, "--map"), d_model)
    roles = {}
    for role, names in NAMES.items():
        for candidate in names:
            named = [n for n in weights if _called(n) == candidate]
            if named:
                roles[role] = (named[0], weights[named[0]])
                break
    if {"q", "k", "v", "o"} <= set(roles):
        return _checked(Mapping({r: roles[r] for r in "qkvo"}, "by name"), d_model)
    if {"qkv", "o"} <= set(roles):
        return _checked(Mapping({r: roles[r] for r in ("qkv", "o")}, "by name"), d_model)
    square = [(n, h) for n, h in weights.items() if _shape(h) == (d_model, d_model)]
    fused = [(n, h) for n, h in weights.items() if _shape(h) in ((3 * d_model, d_model),
                                                                   (d_model, 3 * d_model))]
    if len(square) == 4 and len(weights) == 4:
        return Mapping(dict(zip("qkvo", square)), "by shape, in the order defined")
    if len(fused) == 1 and len(square) == 1 and len(weights) == 2:
        return Mapping({"qkv": fused[0], "o": square[0]}, "by shape")
    raise MhaError(f"could not map your weights: found {_found(weights)}; say which is which with "
                   f"--map, e.g. --map 'q=W_Q,k=W_K,v=W_V,o=W_O'", quantity="map")


def _called(name: str) -> str:
    """What a weight's name says it is: its last part ("heads.*.query" -> "query"), or that
    part's first word when the part names a list ("q_heads.*" -> "q")."""
    parts = [p for p in name.lower().split(".") if p != "*"]
    last = parts[-1] if parts else ""
    return last.split("_")[0] if name.endswith("*") else last


def _checked(mapping: Mapping, d_model: int) -> Mapping:
    for role, (name, layer) in mapping.layers.items():
        want = [(3 * d_model, d_model)] if role == "qkv" else [(d_model, d_model)]
        if role == "qkv" and not isinstance(layer, (nn.Linear, tuple)):
            want.append((d_model, 3 * d_model))  # a bare matrix used as x @ W
        if _shape(layer) not in want:
            raise MhaError(f"{name} has a weight of shape {list(_shape(layer))}; as {role} it "
                           f"should be {list(want[0])}", quantity="map")
    return mapping


def copy_reference(reference: MultiHeadAttention, mapping: Mapping, module=None,
                   transposed: bool = False) -> bool:
    """Put the reference's weights (and biases) into the student's; False if the student's
    projections have no biases (the reference's are then zeroed to match). A bare matrix gets
    W as nn.Linear holds it (x @ W.T), or W.T when `transposed` (x @ W) or its shape says so."""
    layers = mapping.layers
    held = [h for _, hs in layers.values() for h in (hs if isinstance(hs, list) else [hs])]
    has_bias = all(isinstance(h, (nn.Linear, tuple)) and _bias(h) is not None for h in held)
    with torch.no_grad():
        if not has_bias:
            for lin in (reference.W_q, reference.W_k, reference.W_v, reference.W_o):
                lin.bias.zero_()
        source = {"q": reference.W_q, "k": reference.W_k, "v": reference.W_v, "o": reference.W_o}
        for role, (name, target) in layers.items():
            parts = [source[r] for r in ("qkv" if role == "qkv" else role)]
            weight = torch.cat([p.weight for p in parts])
            bias = torch.cat([p.bias for p in parts])
            if isinstance(target, list):  # per head: each its rows
                rows = weight.shape[0] // len(target)
                for i, lin in enumerate(target):
                    lin.weight.copy_(weight[i * rows:(i + 1) * rows])
                    if lin.bias is not None:
                        lin.bias.copy_(bias[i * rows:(i + 1) * rows])
                continue
            if isinstance(target, (nn.Linear, tuple)):
                _weight(target).copy_(weight)
                if _bias(target) is not None:
                    _bias(target).copy_(bias)
                continue
            if transposed or tuple(target.shape) != tuple(weight.shape):
                weight = weight.T
            if isinstance(target, np.ndarray):
                setattr(module, name, weight.numpy().copy())  # float64, whatever it held
            else:
                target.copy_(weight)
    return has_bias


def _weight(layer):
    return layer[0] if isinstance(layer, tuple) else layer.weight


def _bias(layer):
    return layer[1] if isinstance(layer, tuple) else layer.bias


def _square_matrices(mapping: Mapping) -> bool:
    """Whether a bare square matrix is among the projections: x @ W and x @ W.T both run."""
    return any(not isinstance(h, (nn.Linear, tuple, list)) and h.shape[0] == h.shape[1]
               for _, h in mapping.layers.values())


# ---- what went wrong: the first wrong step and a diagnosis --------------------------------

@dataclass
class Bug:
    name: str  # what the student's module does instead
    module: MultiHeadAttention  # the reference with that bug, to test the hypothesis


class _Variant(MultiHeadAttention):
    """The reference with one deliberate mistake, to test what a wrong module does instead."""

    def __init__(self, base: MultiHeadAttention, bug: str):
        super().__init__(base.d_model, base.heads, bias=base.W_q.bias is not None,
                         rope=base.rope, rope_base=base.rope_base)
        self.load_state_dict(base.state_dict())
        self.bug = bug

    def forward(self, q, k=None, v=None, mask=None):
        k = q if k is None else k
        v = q if v is None else v
        B, T = q.size(0), q.size(1)
        bias = self.bug != "bias missing"
        lin = lambda layer, x: nn.functional.linear(x, layer.weight, layer.bias if bias else None)
        if self.bug == "bias missing" and self.W_q.bias is None:
            raise RuntimeError("no bias to miss")
        Q = lin(self.W_q, q).view(B, -1, self.heads, self.d_k).transpose(1, 2)
        K = lin(self.W_k, k).view(B, -1, self.heads, self.d_k).transpose(1, 2)
        V = lin(self.W_v, v).view(B, -1, self.heads, self.d_k).transpose(1, 2)
        if self.rope:
            Q, K = rope(Q, 0, self.rope_base), rope(K, 0, self.rope_base)
            V = rope(V, 0, self.rope_base) if self.bug == "RoPE applied to V too" else V
        keys = {"K not transposed": K, "Q in place of K (scores Q·Qᵀ)": Q.transpose(-2, -1)}.get(
            self.bug, K.transpose(-2, -1))
        scores = Q @ keys
        scale = {"scaled by d_k instead of √d_k": self.d_k, "not scaled at all": 1.0,
                 "scaled by √d_model instead of √d_k": self.d_model ** 0.5}
        scores = scores / scale.get(self.bug, self.d_k ** 0.5)
        if self.bug == "mask inverted" and mask is not None:
            mask = ~mask
        if self.bug == "mask off by one (a query sees one key ahead)" and mask is not None:
            mask = torch.ones_like(mask).tril(1)
        if self.bug == "a causal mask of its own, though none was asked for":
            mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
        after = self.bug == "mask applied after the softmax (rows no longer sum to 1)"
        if mask is not None and not after:
            scores = scores.masked_fill(~mask, float("-inf"))
        axis = {"softmax over the queries instead of the keys": -2,
                "softmax over the heads instead of the keys": 1}.get(self.bug, -1)
        weights = torch.softmax(scores, dim=axis)
        if mask is not None and after:
            weights = weights.masked_fill(~mask, 0.0)
        context = weights @ (K if self.bug == "weights applied to K instead of V" else V)
        if self.bug == "heads merged without transposing back":
            context = context.reshape(B, T, self.d_model)
        else:
            context = context.transpose(1, 2).reshape(B, T, self.d_model)
        out = context if self.bug == "W_O missing" else lin(self.W_o, context)
        return out, weights


BUGS = ("scaled by d_k instead of √d_k", "not scaled at all",
        "softmax over the queries instead of the keys", "heads merged without transposing back",
        "mask inverted", "mask off by one (a query sees one key ahead)", "K not transposed",
        "W_O missing", "bias missing", "a causal mask of its own, though none was asked for",
        "scaled by √d_model instead of √d_k", "Q in place of K (scores Q·Qᵀ)",
        "weights applied to K instead of V",
        "mask applied after the softmax (rows no longer sum to 1)",
        "softmax over the heads instead of the keys", "RoPE applied to V too")


def diagnoses(reference: MultiHeadAttention, x, mask, output: torch.Tensor) -> list[str]:
    """The known mistakes whose output the student's output equals (at some sizes two give the
    same numbers: with d_model = 64 and 8 heads, √d_model is d_k).

    x: the input (B, T, D), or the (q, k, v) tuple a config gives."""
    qkv = x if isinstance(x, tuple) else (x, x, x)
    x, found = qkv[0], []
    for bug in BUGS:
        if bug.startswith("mask") and mask is None or bug.startswith("a causal") and mask is not None:
            continue
        if bug == "K not transposed" and x.size(1) != reference.d_k \
                or bug.startswith("RoPE") and not reference.rope:
            continue  # Q @ K needs T == d_k to run at all
        try:
            with torch.no_grad():
                out, _ = _Variant(reference, bug).double()(*qkv, mask=mask)
        except RuntimeError:
            continue
        if out.shape == output.shape and torch.allclose(out, output.double(), rtol=1e-6, atol=1e-9,
                                                        equal_nan=True):
            found.append(bug)
    return found


@dataclass
class StudentReport:
    label: str
    mapping: str
    fed: str
    output_diff: float
    weights_diff: float | None  # None: the module returns no per-head weights
    tolerance: float
    first_wrong: object = None  # tracer.Step of the student's first step no reference step holds
    reference_step: object = None  # the lecture's step that does the same job
    missing: str | None = None  # a job the lecture's module does after the first wrong step
    diagnosis: str | None = None
    candidates: list = field(default_factory=list)  # every known mistake that matched
    notes: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.output_diff <= self.tolerance and (
            self.weights_diff is None or self.weights_diff <= self.tolerance)


def check(o, given_map: str | None = None, mask_means: str = "any") -> StudentReport:
    """The student's class (o.module) against the lecture's module, at the sizes the run options
    give (64 wide, 4 heads, 6 tokens, a batch of 2 when not given) or on a config."""
    from dataclasses import replace

    if o.window or o.impl not in (None, "explicit") or o.kv_heads:
        raise MhaError("--window, --impl and --kv-heads check the built-in module; with --module "
                       "give sizes (or --config), --mask, --rope and --seed", quantity="module")
    if mask_means not in MASK_WAYS:
        raise MhaError(f"'{mask_means}' is not one of {', '.join(MASK_WAYS)}",
                       quantity="mask-means")
    if o.config is not None:
        from mha_trace.config import load

        config = load(o.config).with_overrides(o.heads, None, o.mask, o.pad, o.rope or None,
                                               o.rope_base)
        return check_on_config(o.module, config, o.init, given_map)
    pick = lambda value, default: default if value is None else value
    sizes = replace(o, d_model=pick(o.d_model, 64), heads=pick(o.heads, 4), seq=pick(o.seq, 6),
                    batch=pick(o.batch, 2), mask=pick(o.mask, "none"), seed=pick(o.seed, 0))
    return check_module(o.module, sizes.d_model, sizes.heads, sizes.seq, sizes.batch, sizes.mask,
                        sizes.seed, o.init, given_map, pick(o.rope_base, 10000.0) if o.rope
                        else None, mask_means)


def check_on_config(spec: str, config, init: str | None, given_map: str | None) -> StudentReport:
    """The student's module on a config: an explicit one's own Q, K, V go to both sides (the
    reference with identity projections, as `heads --config` runs it); a generated one gives the
    sizes, mask and seed."""
    if not config.explicit:
        if config.pad:
            raise MhaError("a config's pad is not applied to your module by verify", quantity="config")
        return check_module(spec, config.d_model, config.heads, len(config.tokens), 1, config.mask,
                            config.seed, init, given_map, config.rope_base if config.rope else None)
    from mha_trace.run import from_config, from_module, module_sizes_for_config
    from mha_trace.usermodule import split_result

    run = from_module(spec, module_sizes_for_config(config, None, None), init,
                      tokens=config.tokens, config=config)
    if len(run.args) != 3:  # one input x: the config's separate Q, K, V cannot be fed
        report = check_module(spec, config.d_model, config.heads, len(config.tokens), 1,
                              config.mask, config.seed, init, given_map,
                              config.rope_base if config.rope else None)
        report.notes.append("it takes one input, so it was checked on seeded input at the "
                            "config's sizes and mask, not on the config's Q, K, V")
        return report
    reference_run = from_config(config)
    if not run.numpy:
        run.module.double()
        run.args = tuple(a.double() for a in run.args)
    traced = _traced_forward(run, run.module, run.args, {} if run.numpy else dict(run.kwargs))
    with torch.no_grad():
        expected, expected_w = reference_run.forward()
    output, weights = split_result(traced.output, run.args[0])
    report = StudentReport(run.label, f"(projections none: {run.how})", run.call,
                           *_differences(output, weights, expected, expected_w), 1e-8)
    if config.W_O is not None:
        report.notes.append("the config's W_O is the lecture side's only: your module's output "
                            "projection is its own")
    if not report.passed:
        reference = reference_run.module
        _where_it_went_wrong(report, traced, trace_reference(reference, reference_run),
                             (reference, tuple(reference_run.args), reference_run.mask),
                             output, expected)
    return report


def trace_reference(reference, reference_run):
    from mha_trace.tracer import trace

    return trace(reference, *reference_run.args, keep_values=True, **reference_run.kwargs)


def check_module(spec: str, d_model: int, heads: int, seq: int, batch: int, mask_kind: str,
                 seed: int, init: str | None, given_map: str | None,
                 rope_base: float | None = None, mask_means: str = "any") -> StudentReport:
    """Build the student's module and the reference at the same sizes, share the weights, compare.
    A bare square weight matrix runs as x @ W and as x @ W.T: both are tried, and the one under
    which more of the computation is right is reported. With `rope_base` the lecture's module
    turns Q and K by RoPE at that base, as the student's should."""
    from mha_trace.run import Sizes, from_module

    sizes = Sizes(batch=batch, seq=seq, d_model=d_model, heads=heads, mask=mask_kind,
                  dtype="float64", seed=seed, rope=rope_base is not None,
                  rope_base=rope_base or 10000.0)
    reports = _each_way(from_module(spec, sizes, init), sizes, given_map, mask_means)
    report = max(reports, key=lambda r: (r.passed, r.first_wrong.index if r.first_wrong else 1e9,
                                         -r.output_diff))
    if report.candidates:
        _confirm_at_a_second_size(report, spec, sizes, init, given_map, mask_means)
    return report


def _confirm_at_a_second_size(report, spec, sizes, init, given_map, mask_means) -> None:
    """Name a mistake only if it gives the student's numbers at twice the width too (d_k doubles,
    √d_model does not): one size can make two mistakes look the same."""
    from dataclasses import replace

    from mha_trace.run import from_module

    d_k = sizes.d_model // sizes.heads
    second = replace(sizes, d_model=2 * sizes.d_model,
                     seq=2 * sizes.seq if sizes.seq == d_k else sizes.seq)
    try:
        run = from_module(spec, second, init)
    except MhaError:  # --init fixes the width: one size is all there is
        report.notes.append(f"the diagnosis was seen at d_model={sizes.d_model} only (your "
                            f"--init fixes the sizes)")
        return
    seen = {c for r in _each_way(run, second, given_map, mask_means) for c in r.candidates}
    both = [c for c in report.candidates if c in seen]
    report.diagnosis = both[0] if both else None
    if not both:
        report.notes.append(f"a known mistake gave these numbers at d_model={sizes.d_model} but "
                            f"not at {second.d_model}, so none is named")


@dataclass(frozen=True)
class Way:
    """How the student's module is read and fed: a bare square matrix as x @ W.T or x @ W; the
    mask as booleans (True: may attend, or True: blocked), as 1/0 or added (0 / -inf); a batch
    or one sequence."""

    transposed: bool = False
    mask_as: str = "bool"
    unbatched: bool = False

    def notes(self) -> list:
        mask = {"0-1": "its mask is read as numbers, 1 where a query may attend and 0 where not",
                "additive": "its mask is added to the scores: 0 where a query may attend, -inf "
                            "where not",
                "blocked": "its mask means True where a query may NOT attend (the convention of "
                           "the chapter \"Multi-Head Attention\" and nn.MultiheadAttention; the "
                           "lecture's is True where it may), and it was fed so; if you meant True "
                           "where it may, the mask is inverted (--mask-means keep checks that)"
                }.get(self.mask_as)
        one = "it takes one sequence (T, d_model), so it was fed one, unbatched"
        return [n for n in (mask, one if self.unbatched else None) if n]


MASK_WAYS = {"any": ("bool", "blocked", "0-1", "additive"), "keep": ("bool", "0-1", "additive"),
             "blocked": ("blocked",)}


def _each_way(run, sizes, given_map: str | None, mask_means: str = "any") -> list:
    """The student's module checked the usual way and, when it is not right that way, the other
    ways a correct module may be written: a bare square matrix used as x @ W (not x @ W.T), a mask
    of numbers, one sequence rather than a batch. A way that does not run is left out; if none
    runs, the usual way's error is the one given."""
    module = run.module if run.numpy else run.module.double()
    mapping = find_projections(module, sizes.d_model, given_map) if _weights(module) or given_map \
        else None
    turns = (False, True) if mapping is not None and _square_matrices(mapping) else (False,)
    masks = ("bool",) if sizes.mask == "none" else MASK_WAYS[mask_means]
    batches = (False,) if run.numpy else (False, True)
    usual = [Way(t, masks[0]) for t in turns]
    others = [Way(t, m, u) for u in batches for m in masks for t in turns
              if (m, u) != (masks[0], False)]
    reports, error = [], None
    for way in usual:
        try:
            reports.append(_check_once(run, module, mapping, sizes, way))
        except MhaError as e:
            error = error or e
    if any(r.passed for r in reports):
        return reports
    for way in others:
        try:
            report = _check_once(run, module, mapping, sizes, way, explain=False)
        except MhaError:
            continue
        if report.passed:
            return [report]
    if not reports:
        raise error
    return reports


def _check_once(run, module, mapping: Mapping | None, sizes, way: Way,
                explain: bool = True) -> StudentReport:
    from mha_trace.run import make_mask
    from mha_trace.tracer import trace
    from mha_trace.usermodule import forward_call, split_result

    reference, mapping, biased = _reference_for(module, mapping, sizes, way.transposed)
    one = run.numpy or way.unbatched
    x = torch.randn(1 if one else sizes.batch, sizes.seq, sizes.d_model, dtype=torch.float64)
    mask = make_mask(sizes.seq, sizes.mask)
    fed = x[0].numpy() if run.numpy else x[0] if one else x
    call, args, kwargs = forward_call(module, fed, _mask_as(mask, way.mask_as, run.numpy))
    if "use_projections" in inspect.signature(module.forward).parameters and mapping.layers:
        kwargs["use_projections"] = True  # the chapter's class: let it use the copied weights
        call = call[:-1] + ", use_projections=True)"
    with torch.no_grad():
        expected, expected_w = reference(x, mask=mask)
    traced = _traced_forward(run, module, args, kwargs)
    output, weights = split_result(traced.output, fed)
    report = StudentReport(run.label, mapping.describe(), call,
                           *_differences(output, weights, expected, expected_w), 1e-8)
    if not report.passed and sizes.rope:
        _other_rope_convention(report, reference, x, mask, output, weights)
    if not biased:
        report.notes.append("its projections have no biases, so the reference's were set to zero")
    if _square_matrices(mapping):
        report.notes.append(f"its weight matrices are used as "
                            f"{'x @ W' if way.transposed else 'x @ W.T'} (both ways round were tried)")
    report.notes += way.notes()
    if not report.passed and explain:
        _where_it_went_wrong(report, traced, trace(reference, x, mask=mask, keep_values=True),
                             (reference, x, mask), output, expected)
    return report


def _reference_for(module, mapping: Mapping | None, sizes, transposed: bool) -> tuple:
    """(the lecture's module with the student's weights, the mapping, whether biases are used).
    Without projections of its own (the chapter's split) the lecture's become the identity."""
    torch.manual_seed(sizes.seed)
    reference = MultiHeadAttention(sizes.d_model, sizes.heads, rope=sizes.rope,
                                   rope_base=sizes.rope_base).double()
    if mapping is not None:
        return reference, mapping, copy_reference(reference, mapping, module, transposed)
    with torch.no_grad():
        for lin in (reference.W_q, reference.W_k, reference.W_v, reference.W_o):
            lin.weight.copy_(torch.eye(sizes.d_model, dtype=torch.float64))
            lin.bias.zero_()
    return reference, Mapping({}, "none: it splits Q, K, V as given, so the lecture's projections "
                                  "were set to the identity"), True


def _mask_as(mask, kind: str, numpy: bool):
    """The boolean mask (True: may attend) as the student's module takes it."""
    if mask is None:
        return None
    if kind == "blocked":
        mask = ~mask
    elif kind != "bool":
        mask = mask.double() if kind == "0-1" else torch.zeros(mask.shape, dtype=torch.float64) \
            .masked_fill(~mask, float("-inf"))
    return mask.numpy() if numpy else mask


def _other_rope_convention(report, reference, x, mask, output, weights) -> None:
    """Pass a module whose RoPE turns interleaved pairs: it is the lecture's with each head's Q
    and K dims reordered (evens, then odds), which leaves every Q·Kᵀ as it is."""
    d_k, twin = reference.d_k, copy.deepcopy(reference)
    order = torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])
    order = torch.cat([order + h * d_k for h in range(reference.heads)])
    with torch.no_grad():
        for lin in (twin.W_q, twin.W_k):
            lin.weight.copy_(lin.weight[order])
            lin.bias.copy_(lin.bias[order])
        expected, expected_w = twin(x, mask=mask)
    diffs = _differences(output, weights, expected, expected_w)
    if max(d for d in diffs if d is not None) <= report.tolerance:
        report.output_diff, report.weights_diff = diffs
        report.notes.append("its RoPE turns neighbouring pairs (x₀, x₁), (x₂, x₃), … as GPT-J and "
                            "RoFormer do, where the lecture's turns the two halves (x₀, x_{d_k/2}), "
                            "… as GPT-NeoX and LLaMA do: a convention, not a mistake (it equals the "
                            "lecture's module with each head's Q and K dims reordered, which leaves "
                            "Q·Kᵀ as it is)")


def _traced_forward(run, module, args: tuple, kwargs: dict):
    """The student's forward, traced op by op with every value kept, under the user-code guard;
    a failure is one error naming it."""
    from mha_trace.usermodule import explain_exception, user_code

    if run.numpy:
        from mha_trace import nptrace as tracer
    else:
        from mha_trace import tracer
    try:
        with torch.no_grad(), user_code(f"{run.label}: forward"):
            return tracer.trace(module, *args, watch=(run.source,), keep_values=True, **kwargs)
    except tracer.ForwardFailed as failed:
        from mha_trace.output import display_path

        f = failed.trace.failure
        where = f" at {display_path(f.file)}:{f.line} ({f.source.strip()})" if f.line else ""
        raise MhaError(f"{run.label}: forward raised{where}: {f.message}"
                       + (f" (hint: {f.hint})" if f.hint else ""), exit_code=1) from None
    except MhaError:
        raise
    except Exception as e:
        raise MhaError(f"{run.label}: forward raised {explain_exception(e)}", exit_code=1) from None


def _as_expected(output, expected):
    """The output in the reference's (B, T, d_model) shape when it is that or, for a batch of
    one, unbatched (T, d_model), as a NumPy class returns; any other shape stays as it is (a
    flattened output is wrong, whatever its values)."""
    unbatched = expected.shape[0] == 1 and output.shape == expected.shape[1:]
    return output.reshape(expected.shape) if unbatched else output


def _differences(output, weights, expected, expected_w) -> tuple:
    """(largest output difference, largest weights difference or None): an unbatched output or
    weights are compared reshaped, weights averaged over heads against the average."""
    output = _as_expected(output, expected)
    diff = float((output.double() - expected).abs().max()) if output.shape == expected.shape \
        else float("inf")
    if weights is None:
        return diff, None
    w = weights.double()
    if w.shape != expected_w.shape and w.numel() == expected_w.numel():
        w = w.reshape(expected_w.shape)  # unbatched (H, T, T), as a NumPy class returns
    if w.shape == expected_w.shape:
        return diff, float((w - expected_w).abs().max())
    if w.numel() == expected_w.mean(1).numel():  # a module that averages its heads
        return diff, float((w.reshape(expected_w.mean(1).shape) - expected_w.mean(1)).abs().max())
    return diff, None


def _where_it_went_wrong(report, traced, ref_trace, diagnose_args: tuple, output, expected) -> None:
    """A wrong module's first wrong step, the reference's step beside it, and a diagnosis."""
    report.first_wrong, report.reference_step, report.missing = first_wrong_step(
        traced.steps, ref_trace.steps)
    output = _as_expected(output, expected)
    if output.shape != expected.shape:
        report.notes.append(f"its output has shape {list(output.shape)}; the lecture's has "
                            f"{list(expected.shape)} (batch, seq, d_model)")
    if output.shape == expected.shape:
        report.candidates = diagnoses(*diagnose_args, output)
        report.diagnosis = report.candidates[0] if report.candidates else None
