"""A student's four projections: found by name (W_q / query / q_proj ..., fused c_attn / qkv /
in_proj), by shape, or given with --map, checked, and the lecture's weights copied into them."""

import re
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from mha_trace.core.attention import MultiHeadAttention
from mha_trace.errors import MhaError

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
    biases: dict = field(default_factory=dict)  # role -> (name, 1-D bias) beside a bare matrix
    stray: list = field(default_factory=list)  # 1-D parameters no projection claims: [(name, t)]

    def describe(self) -> str:
        if not self.layers:
            return f"(projections {self.how})"
        beside = lambda role: f"+{self.biases[role][0]}" if role in self.biases else ""
        return ", ".join(f"{role}={name}{beside(role)}" for role, (name, _) in self.layers.items()) \
            + f" ({self.how})"


def _linears(module: nn.Module) -> dict:
    return {name: m for name, m in module.named_modules() if isinstance(m, nn.Linear)}


def named_weights(module) -> dict:
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
    """The student's Q, K, V and output projections (by --map, by name, or by shape), with the
    biases kept beside bare matrices (b_q beside W_q, q_bias beside q_weight, ...)."""
    mapping = _projections(module, d_model, given)
    return _with_biases(mapping, module, d_model)


BY_ORDER = "by shape, in the order defined"


def other_orders(mapping: Mapping, module, d_model: int):
    """When four d_model × d_model matrices were mapped only by the order they were defined in,
    every other assignment of them to q, k, v and o (23 more), each with its biases."""
    from itertools import permutations

    if mapping.how != BY_ORDER:
        return
    held = list(mapping.layers.values())
    for order in permutations(held):
        if list(order) != held:
            yield _with_biases(Mapping(dict(zip("qkvo", order)), "by trying every order"),
                               module, d_model)


def _vectors(module) -> dict:
    """The 1-D parameters, buffers or arrays that could be biases."""
    if not isinstance(module, nn.Module):
        return {n: v for n, v in vars(module).items() if isinstance(v, np.ndarray) and v.ndim == 1}
    linears = _linears(module)
    return {n: t for n, t in [*module.named_parameters(), *module.named_buffers()]
            if t.dim() == 1 and n.rpartition(".")[0] not in linears}


def _stem(name: str, marks: tuple) -> str:
    """A weight's or bias's name without what says weight or bias: W_q, b_q, q_bias -> q."""
    last = name.lower().rpartition(".")[2]
    for mark in marks:
        for form in (f"{mark}_", f"_{mark}"):
            if last.startswith(form) and form.endswith("_"):
                return last[len(form):]
            if last.endswith(form) and form.startswith("_"):
                return last[:-len(form)]
    return last[1:] if last[:1] == marks[-1] and len(last) > 1 else last


_ROLE = r"(q|k|v|o|qkv|query|key|value|out|output|proj|attn|in|c_attn|c_proj|\d+)"
BIAS_NAME = re.compile(rf"(b|bias)(_?{_ROLE})?|{_ROLE}_?(b|bias)")  # b_q, bias_k, q_bias, bo, ...


def _with_biases(mapping: Mapping, module, d_model: int) -> Mapping:
    vectors = _vectors(module)
    biases = {}
    for role, (name, held) in mapping.layers.items():
        if isinstance(held, (nn.Linear, tuple, list)):
            continue
        size = 3 * d_model if role == "qkv" else d_model
        stem = _stem(name, ("weight", "w"))
        found = [n for n, v in vectors.items() if _stem(n, ("bias", "b")) == stem
                 and tuple(v.shape) == (size,)]
        if len(found) == 1:
            biases[role] = (found[0], vectors[found[0]])
    claimed = {n for n, _ in biases.values()}
    stray = [(n, v) for n, v in vectors.items() if n not in claimed and BIAS_NAME.fullmatch(
        n.lower().rpartition(".")[2]) and v.shape[0] in (d_model, 3 * d_model)]
    return Mapping(mapping.layers, mapping.how, biases, stray)


def _projections(module, d_model: int, given: str | None) -> Mapping:
    if isinstance(module, nn.MultiheadAttention):
        pair = (module.in_proj_weight, module.in_proj_bias)
        return Mapping({"qkv": ("in_proj_weight", pair), "o": ("out_proj", module.out_proj)}, "by name")
    weights = named_weights(module)
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
        return Mapping(dict(zip("qkvo", square)), BY_ORDER)
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
    has_bias = all(role in mapping.biases if not isinstance(hs, (nn.Linear, tuple, list)) else
                   all(_bias(h) is not None for h in (hs if isinstance(hs, list) else [hs]))
                   for role, (_, hs) in layers.items())
    with torch.no_grad():
        if not has_bias:
            for lin in (reference.W_q, reference.W_k, reference.W_v, reference.W_o):
                lin.bias.zero_()
        _zero_strays(mapping, module)
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
            _put(module, name, target, weight)
            if role in mapping.biases and has_bias:
                _put(module, *mapping.biases[role], bias)
    return has_bias


def _put(module, name: str, target, value: torch.Tensor) -> None:
    """A tensor's values into the student's parameter, or a NumPy class's array attribute."""
    if isinstance(target, np.ndarray):
        setattr(module, name, value.numpy().copy())  # float64, whatever it held
    else:
        target.copy_(value)


def _zero_strays(mapping: Mapping, module) -> None:
    """1-D parameters no projection claims (biases under names that say nothing) are zeroed, as
    the reference's biases are when not every projection has one: never a wrong verdict for how
    a correct module names its biases."""
    for name, t in mapping.stray:
        _put(module, name, t, torch.zeros(t.shape, dtype=torch.float64))


def _weight(layer):
    return layer[0] if isinstance(layer, tuple) else layer.weight


def _bias(layer):
    return layer[1] if isinstance(layer, tuple) else layer.bias


def square_matrices(mapping: Mapping) -> bool:
    """Whether a bare square matrix is among the projections: x @ W and x @ W.T both run."""
    return any(not isinstance(h, (nn.Linear, tuple, list)) and h.shape[0] == h.shape[1]
               for _, h in mapping.layers.values())
