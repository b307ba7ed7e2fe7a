"""A student's four projections: found by name (W_q / query / q_proj ..., fused c_attn / qkv /
in_proj), by shape, by data flow (what each weight does in the forward pass), or given with --map,
and checked (copied.py copies the lecture's weights into them)."""

import re
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

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

    layers: dict  # role ("q", "k", "v", "o", "qkv", "kv") -> (name, nn.Linear or (weight, bias) pair)
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
        self.parts, self.how = parts, how  # how: "in" [H, D, d], "out" [H, d, D], "flax" [D, H, d], "side", "flat"

    @property
    def value(self) -> torch.Tensor:
        t = self.parts[0]
        if self.how == "in":
            return t.permute(1, 0, 2).reshape(t.shape[1], -1)
        if self.how in ("out", "flat", "flax"):
            return t.reshape(-1, t.shape[-1]) if self.how == "out" else t.reshape(t.shape[0], -1) \
                if self.how == "flax" else t.reshape(-1)
        return torch.cat(list(self.parts), dim=1)

    @property
    def shape(self) -> tuple:
        return tuple(self.value.shape)

    def copy_(self, value: torch.Tensor) -> None:
        t = self.parts[0]
        if self.how == "in":
            t.copy_(value.reshape(t.shape[1], t.shape[0], t.shape[2]).permute(1, 0, 2))
        elif self.how in ("out", "flat", "flax"):
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
            found[name] = Joined([t], _kernel_layout(name, t.shape))
    return _per_head(found)


def _kernel_layout(name: str, shape: tuple) -> str:
    """A 3-D per-head weight's layout, by where d_model (its largest axis) is: [H, D, d]
    (TransformerLens' W_Q), [H, d, D] (an output's), or [D, H, d] (a Flax or Haiku kernel)."""
    if _called(name) in NAMES["o"] or shape[2] > shape[1] and shape[2] >= shape[0]:
        return "out"
    return "flax" if shape[0] > shape[1] else "in"


def _is_bias(name: str) -> bool:
    return bool(BIAS_NAME.fullmatch(name.lower().rpartition(".")[2]))


def _per_head(weights: dict) -> dict:
    """Per-head projections (a ModuleList of nn.Linear(d_model, d_k), or of head modules each
    holding its own query, key and value) gathered into one list each, named with * for the
    head: "heads.*.query" holds heads.0.query, heads.1.query, ..."""
    lists: dict = {}
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
    lists: dict = {}
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
        size = role_rows(role, d_model, kv_rows)
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
        return checked(Mapping(roles, "--map"), d_model, kv_rows)
    roles = {}
    for role, names in NAMES.items():
        for candidate in names:
            named = [n for n in weights if _called(n) == candidate]
            if named:
                roles[role] = (named[0], weights[named[0]])
                break
    if {"q", "k", "v", "o"} <= set(roles):
        return checked(Mapping({r: roles[r] for r in "qkvo"}, "by name"), d_model, kv_rows)
    if {"qkv", "o"} <= set(roles):
        return checked(Mapping({r: roles[r] for r in ("qkv", "o")}, "by name"), d_model, kv_rows)
    left = _output_left(weights, roles, d_model)
    if left:  # q, k and v (or qkv) named; the output's name unknown (output_proj, linear, ...)
        inputs = "qkv" if {"q", "k", "v"} <= set(roles) else ("qkv",)
        return checked(Mapping({**{r: roles[r] for r in inputs}, "o": left},
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
    latent = _latent_widths([_shape(h) for h in weights.values()], d_model)
    if latent:
        raise MhaError(f"your weights are multi-head latent attention's (found {_found(weights)}: keys and values "
                       f"come up from a latent of {latent[0]} dims): check it with --latent {latent[0]} --rope-dim "
                       f"{latent[1]}", quantity="latent")
    raise MhaError(f"could not map your weights: found {_found(weights)}; say which is which with "
                   f"--map, e.g. --map 'q=W_Q,k=W_K,v=W_V,o=W_O'", quantity="map")


def _latent_widths(shapes: list, d_model: int) -> tuple | None:
    """(d_c, d_R) when the weights are MLA's: a weight up from d_c < d_model dims (W^UK, W^UV), and
    the down-projection to it fused with the RoPE key (d_c + d_R rows) or beside one (d_R rows)."""
    downs = [rows for rows, cols in shapes if cols == d_model and rows < d_model]
    for c in sorted({cols for rows, cols in shapes if cols < d_model and rows >= cols}):
        rope = [n - c for n in downs if n > c] or [n for n in downs if n < c and c in downs]
        if rope:
            return c, rope[0]
    return None


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


def role_rows(role: str, d_model: int, kv_rows: int) -> int:
    """The rows a projection of this role has (q and o d_model; k and v kv_rows; fused, their sum)."""
    return sum(kv_rows if r in "kv" else d_model for r in role)


def checked(mapping: Mapping, d_model: int, kv_rows: int) -> Mapping:
    for role, (name, layer) in mapping.layers.items():
        rows = role_rows(role, d_model, kv_rows)
        want = [(rows, d_model)]
        if rows != d_model and not isinstance(layer, (nn.Linear, tuple, list)):
            want.append((d_model, rows))  # a bare matrix used as x @ W
        if _shape(layer) not in want:
            raise MhaError(f"{name} has a weight of shape {list(_shape(layer))}; as {role} it "
                           f"should be {list(want[0])}", quantity="map")
    return mapping


def _weight(layer):
    return layer[0] if isinstance(layer, tuple) else layer.weight


def _bias(layer):
    return layer[1] if isinstance(layer, tuple) else layer.bias


def by_flow(sides: dict, module, d_model: int, kv_rows: int) -> Mapping | None:
    """The projections from the data flow (`core.flow`: the parameters each side of attention was
    computed from): one weight each for q, k, v and the output, or a fused one for q, k and v
    (or k and v); None where the flow does not name one weight a side."""
    weights = named_weights(module)
    owner = {id(t): key for key, held in weights.items() for t in _tensors_of(held)}
    keys = {r: {owner[i] for i in ids if i in owner} for r, ids in sides.items()}
    if set(keys) != set("qkvo") or any(len(k) != 1 for k in keys.values()):
        return None
    q, k, v, o = (keys[r].pop() for r in "qkvo")
    roles = {"qkv": q} if q == k == v else {"q": q, "kv": k} if k == v != q else \
        {"q": q, "k": k, "v": v} if len({q, k, v}) == 3 else None
    if roles is None or o in roles.values():
        return None
    layers = {role: (name, weights[name]) for role, name in {**roles, "o": o}.items()}
    mapping = Mapping(layers, "by data flow")
    return _with_biases(checked(mapping, d_model, kv_rows), module, d_model, kv_rows)


def _tensors_of(held) -> list:
    """The weight tensors a projection holds (never its bias)."""
    if isinstance(held, list):
        return [t for h in held for t in _tensors_of(h)]
    if isinstance(held, Joined):
        return list(held.parts)
    return [_weight(held)] if isinstance(held, (nn.Linear, tuple)) else [held]
