"""A student's four projections: found by name (W_q / query / q_proj ..., fused c_attn / qkv /
in_proj), by shape, or given with --map, checked, and the lecture's weights copied into them."""

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from mha_trace.attention import MultiHeadAttention
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

    def describe(self) -> str:
        if not self.layers:
            return f"(projections {self.how})"
        return ", ".join(f"{role}={name}" for role, (name, _) in self.layers.items()) + f" ({self.how})"


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
    """The student's Q, K, V and output projections: by --map, by name, or by shape."""
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


def square_matrices(mapping: Mapping) -> bool:
    """Whether a bare square matrix is among the projections: x @ W and x @ W.T both run."""
    return any(not isinstance(h, (nn.Linear, tuple, list)) and h.shape[0] == h.shape[1]
               for _, h in mapping.layers.values())
