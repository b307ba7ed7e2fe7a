"""The classic mistakes, each the lecture's module with one thing done wrong: a student's output
that equals one of them is diagnosed as that mistake."""

from dataclasses import dataclass

import torch
import torch.nn as nn

from mha_trace.core.attention import MultiHeadAttention, rope

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
