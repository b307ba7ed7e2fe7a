"""The lecture's weights copied into a student's projections, once they are found
(projections.py): each role's rows, a fused qkv's in its order (or head by head), a bare matrix
as the module uses it, the biases beside it, and the biases no projection claims zeroed."""

import numpy as np
import torch
import torch.nn as nn

from mha_trace.analyses.projections import Mapping, _bias, _weight
from mha_trace.core.attention import MultiHeadAttention


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
            parts = [source[r] for r in role]  # "qkv" and "kv": fused, their rows in that order
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
                bias_name, bias_target = mapping.biases[role]
                _put(module, bias_name, bias_target, bias)
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


def square_matrices(mapping: Mapping) -> bool:
    """Whether a bare square matrix is among the projections: x @ W and x @ W.T both run."""
    return any(not isinstance(h, (nn.Linear, tuple, list)) and h.shape[0] == h.shape[1]
               for _, h in mapping.layers.values())


def take_scoring(reference: MultiHeadAttention, module) -> None:
    """The student's own sink logits (one a head), QK-norm gains (d_k each, named for q and k), T5's
    bias table (32 buckets by H) and differential attention's λ vectors (d_k/2 each, named lambda_q1 ... as the paper names them)
    put into the reference, found by shape: the variant's parameters are the student's to set; what
    is checked is what its forward does with them. Left as the reference's when not found."""
    if not isinstance(module, nn.Module):
        return
    own = dict(module.named_parameters()) | dict(module.named_buffers())
    with torch.no_grad():
        sinks = [t for t in own.values() if tuple(t.shape) == (reference.heads,)]
        if reference.sinks == "learned" and len(sinks) == 1:
            reference.sink.copy_(sinks[0])
        gains = {n.lower(): t for n, t in own.items() if tuple(t.shape) == (reference.d_k,)}
        q = [t for n, t in gains.items() if "q" in n and "k" not in n]
        k = [t for n, t in gains.items() if "k" in n and "q" not in n]
        if reference.qk_norm and len(q) == len(k) == 1:
            reference.q_norm.weight.copy_(q[0])
            reference.k_norm.weight.copy_(k[0])
        tables = [t for t in own.values() if tuple(t.shape) in ((32, reference.heads), (reference.heads, 32))]
        if reference.relative_bias and len(tables) == 1:  # T5's (buckets, H) table, or its transpose
            table = tables[0]
            reference.rel_bias.weight.copy_(table if tuple(table.shape) == (32, reference.heads) else table.T)
        lambdas = {n.split(".")[-1].lower(): t for n, t in own.items() if tuple(t.shape) == (reference.d_k // 2,)}
        if reference.diff and {"lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"} <= set(lambdas):
            for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
                getattr(reference, name).copy_(lambdas[name])
