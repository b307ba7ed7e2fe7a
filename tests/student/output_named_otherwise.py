"""CS336's names: q_proj, k_proj, v_proj and output_proj (an output name the lecture's list does
not hold); and the same with F.dropout left on (training=True unless told, so random in eval)."""

import math

import torch.nn as nn
import torch.nn.functional as F


class OutputProj(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_model, d_model, bias=False)
        self.v_proj = nn.Linear(d_model, d_model, bias=False)
        self.output_proj = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        B, T, D = x.shape
        q, k, v = (W(x).view(B, T, self.h, D // self.h).transpose(1, 2)
                   for W in (self.q_proj, self.k_proj, self.v_proj))
        w = self.weights(q @ k.transpose(-2, -1) / math.sqrt(D // self.h))
        return self.output_proj((w @ v).transpose(1, 2).reshape(B, T, D))

    def weights(self, scores):
        return scores.softmax(-1)


class DropoutLeftOn(OutputProj):
    def weights(self, scores):
        return F.dropout(scores.softmax(-1), 0.1)
