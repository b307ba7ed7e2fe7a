"""One student module per classic bug: each must be caught, and named."""
import math
import torch
import torch.nn as nn


class Base(nn.Module):
    bug = ""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k, self.d_model = num_heads, d_model // num_heads, d_model
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, _ = x.shape
        bias = self.bug != "bias"
        lin = lambda layer, t: nn.functional.linear(t, layer.weight, layer.bias if bias else None)
        q = lin(self.W_q, x).view(B, T, self.h, self.d_k).transpose(1, 2)
        k = lin(self.W_k, x).view(B, T, self.h, self.d_k).transpose(1, 2)
        v = lin(self.W_v, x).view(B, T, self.h, self.d_k).transpose(1, 2)
        scores = q @ (k if self.bug == "no_transpose" else q.transpose(-2, -1) if self.bug == "q_for_k" else k.transpose(-2, -1))
        scores = scores / {"d_k": self.d_k, "no_scale": 1, "d_model": math.sqrt(self.d_model)}.get(self.bug, math.sqrt(self.d_k))
        if mask is not None:
            keep = ~mask if self.bug == "mask_inverted" else mask
            if self.bug == "mask_off_by_one":
                keep = torch.ones_like(mask).tril(1)
            scores = scores if self.bug == "mask_after" else scores.masked_fill(~keep, float("-inf"))
        weights = torch.softmax(scores, dim={"axis": -2, "heads_axis": 1}.get(self.bug, -1))
        if mask is not None and self.bug == "mask_after":
            weights = weights.masked_fill(~mask, 0.0)
        context = weights @ (k if self.bug == "weights_k" else v)
        if self.bug == "merge":
            context = context.reshape(B, T, self.d_model)
        else:
            context = context.transpose(1, 2).reshape(B, T, self.d_model)
        return (context if self.bug == "no_wo" else lin(self.W_o, context)), weights


class ScaledByDk(Base): bug = "d_k"
class NotScaled(Base): bug = "no_scale"
class WrongAxis(Base): bug = "axis"
class MergedWithoutTranspose(Base): bug = "merge"
class MaskInverted(Base): bug = "mask_inverted"
class MaskOffByOne(Base): bug = "mask_off_by_one"
class KNotTransposed(Base): bug = "no_transpose"
class NoWO(Base): bug = "no_wo"
class NoBias(Base): bug = "bias"
class ScaledBySqrtDModel(Base): bug = "d_model"
class QInPlaceOfK(Base): bug = "q_for_k"
class WeightsTimesK(Base): bug = "weights_k"
class MaskAfterSoftmax(Base): bug = "mask_after"
class SoftmaxOverHeads(Base): bug = "heads_axis"
class Correct(Base): bug = ""
