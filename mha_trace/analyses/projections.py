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
    "q": ("q_lin", "w_q", "wq", "q_proj", "query", "to_q", "q_linear", "linear_q", "linear_query", "q"),
    "k": ("k_lin", "w_k", "wk", "k_proj", "key", "to_k", "k_linear", "linear_k", "linear_keys", "k"),
    "v": ("v_lin", "w_v", "wv", "v_proj", "value", "to_v", "v_linear", "linear_v", "linear_values", "v"),
    "o": ("w_o", "wo", "o_proj", "out_proj", "out_lin", "out", "output", "to_out", "c_proj", "proj", "dense",
          "o_linear", "linear_out", "fc_out", "final_linear", "o"),
    "qkv": ("c_attn", "qkv", "w_qkv", "wqkv", "qkv_proj", "in_proj", "query_key_value", "to_qkv"),
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


class Joined:
    """Per-head weights seen as the one matrix they make, used as x @ W: TransformerLens' 3-D
    W_Q [H, d_model, d_k] (and W_O [H, d_k, d_model]), an nn.ParameterList of the paper's W_i^Q
    (d_model, d_k) side by side, or a per-head bias [H, d_k] as one vector. `copy_` writes a
    matrix of that shape back into the parts."""

    def __init__(self, parts: list, how: str):
        self.parts, self.how = parts, how  # how: "in" [H, D, d], "out" [H, d, D], "side", "flat"

    @property
    def value(self) -> torch.Tensor:
        t = self.parts[0]
        if self.how == "in":
            return t.permute(1, 0, 2).reshape(t.shape[1], -1)
        if self.how in ("out", "flat"):
            return t.reshape(-1, t.shape[-1]) if self.how == "out" else t.reshape(-1)
        return torch.cat(list(self.parts), dim=1)

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape)

    def copy_(self, value: torch.Tensor) -> None:
        t = self.parts[0]
        if self.how == "in":
            t.copy_(value.reshape(t.shape[1], t.shape[0], t.shape[2]).permute(1, 0, 2))
        elif self.how in ("out", "flat"):
            t.copy_(value.reshape(t.shape))
        else:
            for part, piece in zip(self.parts, value.split(self.parts[0].shape[1], dim=1)):
                part.copy_(piece)


def named_weights(module) -> dict:
    """Where a projection can live: each nn.Linear, each 2-D parameter or buffer outside one
    (used as x @ W or x @ W.T), each 3-D per-head weight [H, d_model, d_k] as the matrix it makes,
    and on a NumPy class each 2-D array attribute."""
    if not isinstance(module, nn.Module):
        return {n: v for n, v in vars(module).items() if isinstance(v, np.ndarray) and v.ndim == 2}
    found = _linears(module)
    for name, t in [*module.named_parameters(), *module.named_buffers()]:
        if name.rpartition(".")[0] in found or _is_bias(name):
            continue
        if t.dim() == 2:
            found[name] = t
        elif t.dim() == 3 and t.is_floating_point():
            out = _called(name) in NAMES["o"] or t.shape[2] > t.shape[1]
            found[name] = Joined([t], "out" if out else "in")
    return _per_head(found)


def _is_bias(name: str) -> bool:
    return bool(BIAS_NAME.fullmatch(name.lower().rpartition(".")[2]))


def _per_head(weights: dict) -> dict:
    """Per-head projections (a ModuleList of nn.Linear(d_model, d_k), or of head modules each
    holding its own query, key and value) gathered into one list each, named with * for the
    head: "heads.*.query" holds heads.0.query, heads.1.query, ..."""
    lists = {}
    for name, held in weights.items():
        if isinstance(held, nn.Linear) and any(p.isdigit() for p in name.split(".")):
            lists.setdefault(".".join("*" if p.isdigit() else p for p in name.split(".")), []) \
                .append(name)
    square = lambda n: weights[n].weight.shape[0] == weights[n].weight.shape[1]
    lists = {k: names for k, names in lists.items() if not all(square(n) for n in names)}
    # (the Annotated Transformer's `linears`: four d_model × d_model layers, one per projection)
    grouped = {n for names in lists.values() if len(names) > 1 for n in names}
    found = {n: h for n, h in weights.items() if n not in grouped}
    found |= {key: [weights[n] for n in names] for key, names in lists.items() if len(names) > 1}
    return found | _side_by_side(found)


def _side_by_side(weights: dict) -> dict:
    """The paper's per-head matrices in an nn.ParameterList (W_Q.0, W_Q.1, ... each d_model ×
    d_k), joined into one d_model × (H·d_k) matrix named W_Q; their parts leave `weights`."""
    lists = {}
    for name, held in weights.items():
        head, _, last = name.rpartition(".")
        if last.isdigit() and isinstance(held, torch.Tensor) and held.dim() == 2:
            lists.setdefault(head, []).append(name)
    joined = {}
    for head, names in lists.items():
        if len(names) > 1 and len({tuple(weights[n].shape) for n in names}) == 1:
            joined[head] = Joined([weights.pop(n) for n in names], "side")
    return joined


def _shape(holder) -> tuple:
    if isinstance(holder, list):  # per-head projections, stacked as one
        return sum(_shape(h)[0] for h in holder), _shape(holder[0])[1]
    return tuple(_weight(holder).shape) if isinstance(holder, (nn.Linear, tuple)) else tuple(holder.shape)


def _found(weights: dict) -> str:
    return ", ".join(f"{n} {list(_shape(h))}" for n, h in weights.items()) or "none"


def find_projections(module, d_model: int, given: str | None = None,
                     kv_rows: int | None = None) -> Mapping:
    """The student's Q, K, V and output projections (by --map, by name, or by shape), with the
    biases kept beside bare matrices (b_q beside W_q, q_bias beside q_weight, ...). kv_rows: the
    width of K and V when they have fewer heads than Q (grouped-query attention)."""
    mapping = _projections(module, d_model, given, kv_rows or d_model)
    return _with_biases(mapping, module, d_model, kv_rows or d_model)


def kv_rows_of(module, d_model: int) -> int | None:
    """The width of K and V, read from the weights when it is less than d_model (a module of
    grouped- or multi-query attention): a K projection by name, or a fused one of d_model + 2r
    rows."""
    weights = named_weights(module)
    for name, held in weights.items():
        rows, cols = _shape(held)
        if cols != d_model and rows == d_model and _called(name) not in NAMES["o"]:
            rows, cols = cols, rows  # a bare matrix used as x @ W
        if cols != d_model:
            continue
        if _called(name) in NAMES["k"] + NAMES["v"] and rows < d_model:
            return rows
        if _called(name) in NAMES["qkv"] and d_model < rows < 3 * d_model \
                and (rows - d_model) % 2 == 0:
            return (rows - d_model) // 2
    return None


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
    found = {n: t for n, t in [*module.named_parameters(), *module.named_buffers()]
             if t.dim() == 1 and n.rpartition(".")[0] not in linears}
    return found | {n: Joined([t], "flat") for n, t in module.named_parameters()
                    if t.dim() == 2 and _is_bias(n)}  # a bias per head, [H, d_k]


def _stem(name: str, marks: tuple) -> str:
    """A weight's or bias's name without what says weight or bias: W_q, b_q, q_bias -> q."""
    parts = name.lower().split(".")
    if len(parts) > 1 and parts[-1] in ("weight", "bias"):
        return parts[-2]  # a layer's own weight and bias (Hugging Face's Conv1D)
    last = parts[-1]
    for mark in marks:
        for form in (f"{mark}_", f"_{mark}"):
            if last.startswith(form) and form.endswith("_"):
                return last[len(form):]
            if last.endswith(form) and form.startswith("_"):
                return last[:-len(form)]
    return last[1:] if last[:1] == marks[-1] and len(last) > 1 else last


_ROLE = r"(q|k|v|o|qkv|query|key|value|out|output|proj|attn|in|c_attn|c_proj|\d+)"
BIAS_NAME = re.compile(rf"(b|bias)(_?{_ROLE})?|{_ROLE}_?(b|bias)")  # b_q, bias_k, q_bias, bo, ...


def _with_biases(mapping: Mapping, module, d_model: int, kv_rows: int | None = None) -> Mapping:
    vectors = _vectors(module)
    biases, kv_rows = {}, kv_rows or d_model
    for role, (name, held) in mapping.layers.items():
        if isinstance(held, (nn.Linear, tuple, list)):
            continue
        size = {"qkv": d_model + 2 * kv_rows, "k": kv_rows, "v": kv_rows}.get(role, d_model)
        stem = _stem(name, ("weight", "w"))
        found = [n for n, v in vectors.items() if _stem(n, ("bias", "b")) == stem
                 and tuple(v.shape) == (size,)]
        if len(found) == 1:
            biases[role] = (found[0], vectors[found[0]])
    claimed = {n for n, _ in biases.values()}
    stray = [(n, v) for n, v in vectors.items() if n not in claimed and BIAS_NAME.fullmatch(
        n.lower().rpartition(".")[2]) and v.shape[0] in (d_model, 3 * d_model)]
    return Mapping(mapping.layers, mapping.how, biases, stray)


def _projections(module, d_model: int, given: str | None, kv_rows: int) -> Mapping:
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
        return _checked(Mapping(roles, "--map"), d_model, kv_rows)
    roles = {}
    for role, names in NAMES.items():
        for candidate in names:
            named = [n for n in weights if _called(n) == candidate]
            if named:
                roles[role] = (named[0], weights[named[0]])
                break
    if {"q", "k", "v", "o"} <= set(roles):
        return _checked(Mapping({r: roles[r] for r in "qkvo"}, "by name"), d_model, kv_rows)
    if {"qkv", "o"} <= set(roles):
        return _checked(Mapping({r: roles[r] for r in ("qkv", "o")}, "by name"), d_model, kv_rows)
    left = _output_left(weights, roles, d_model)
    if left:  # q, k and v (or qkv) named; the output's name unknown (output_proj, linear, ...)
        inputs = "qkv" if {"q", "k", "v"} <= set(roles) else ("qkv",)
        return _checked(Mapping({**{r: roles[r] for r in inputs}, "o": left},
                                f"by name; o: {left[0]}, the one d_model × d_model weight left"), d_model, kv_rows)
    square = [(n, h) for n, h in weights.items() if _shape(h) == (d_model, d_model)]
    fused = [(n, h) for n, h in weights.items() if _shape(h) in ((d_model + 2 * kv_rows, d_model),
                                                                   (d_model, d_model + 2 * kv_rows))]
    if len(square) == 4 and len(weights) == 4:
        lists = {n.rpartition(".")[0] for n, _ in square}
        if len(lists) == 1 and [n.rpartition(".")[2] for n, _ in square] == ["0", "1", "2", "3"]:
            return Mapping(dict(zip("qkvo", square)), f"by position in {lists.pop()}: q, k, v, o, "
                                                      f"as the Annotated Transformer orders them")
        return Mapping(dict(zip("qkvo", square)), BY_ORDER)
    if len(fused) == 1 and len(square) == 1 and len(weights) == 2:
        return Mapping({"qkv": fused[0], "o": square[0]}, "by shape")
    raise MhaError(f"could not map your weights: found {_found(weights)}; say which is which with "
                   f"--map, e.g. --map 'q=W_Q,k=W_K,v=W_V,o=W_O'", quantity="map")


def _output_left(weights: dict, roles: dict, d_model: int) -> tuple | None:
    """(name, weight) of the output projection when the inputs are named (q, k and v, or a fused
    qkv) and exactly one d_model × d_model weight is left over: what else could it be."""
    inputs = [r for r in ("q", "k", "v") if r in roles] if "qkv" not in roles else ["qkv"]
    if inputs not in (["q", "k", "v"], ["qkv"]):
        return None
    taken = {roles[r][0] for r in inputs}
    left = [(n, h) for n, h in weights.items() if n not in taken and _shape(h) == (d_model, d_model)]
    return left[0] if len(left) == 1 else None


def _called(name: str) -> str:
    """What a weight's name says it is: its last part ("heads.*.query" -> "query"), or that
    part's first word when the part names a list ("q_heads.*" -> "q"); a layer's own `weight`
    is named by its layer ("c_attn.weight" -> "c_attn", as Hugging Face's Conv1D holds it)."""
    parts = [p for p in name.lower().split(".") if p != "*"]
    while len(parts) > 1 and (parts[-1] == "weight" or parts[-1].isdigit()):
        parts = parts[:-1]  # to_out.0 (a Sequential's first layer) is to_out
    for suffix in ("_kernel", "_weight"):  # Keras' query_kernel, a bare q_weight
        parts[-1:] = [p.removesuffix(suffix) for p in parts[-1:]]
    last = parts[-1] if parts else ""
    return last.split("_")[0] if name.endswith("*") else last


def _checked(mapping: Mapping, d_model: int, kv_rows: int) -> Mapping:
    for role, (name, layer) in mapping.layers.items():
        rows = {"qkv": d_model + 2 * kv_rows, "k": kv_rows, "v": kv_rows}.get(role, d_model)
        want = [(rows, d_model)]
        if rows != d_model and not isinstance(layer, (nn.Linear, tuple, list)):
            want.append((d_model, rows))  # a bare matrix used as x @ W
        if _shape(layer) not in want:
            raise MhaError(f"{name} has a weight of shape {list(_shape(layer))}; as {role} it "
                           f"should be {list(want[0])}", quantity="map")
    return mapping


def _head_by_head(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows [Q; K; V] reordered head by head, [Q_1; K_1; V_1; Q_2; ...]: a fused qkv that the
    module reshapes to (B, T, H, 3·d_k) before splitting (the UvA tutorials' layout)."""
    q, k, v = (part.reshape(heads, -1, *t.shape[1:]) for part in t.chunk(3))
    return torch.cat([q, k, v], dim=1).reshape(t.shape)


def copy_reference(reference: MultiHeadAttention, mapping: Mapping, module=None,
                   transposed: bool = False, head_by_head: bool = False) -> bool:
    """Put the reference's weights (and biases) into the student's; False if the student's
    projections have no biases (the reference's are then zeroed to match). A bare matrix gets
    W as nn.Linear holds it (x @ W.T), or W.T when `transposed` (x @ W) or its shape says so.
    head_by_head: a fused qkv's rows go head by head (q, k, v of head 1, then of head 2, ...)."""
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
            if role == "qkv" and head_by_head:
                weight, bias = (_head_by_head(t, reference.heads) for t in (weight, bias))
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
