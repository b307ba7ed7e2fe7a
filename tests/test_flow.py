"""The data flow (core/flow.py): which weights each side of attention was computed from, read from
a run of the code, checked on modules whose answer is known by construction."""

import torch
import torch.nn as nn
import torch.nn.functional as F

from mha_trace.core.attention import MultiHeadAttention
from mha_trace.core.flow import data_flow


def _named(module, sides: dict) -> dict:
    names = {id(p): n for n, p in module.named_parameters()}
    return {role: sorted(names[i] for i in ids if i in names) for role, ids in sides.items()}


def test_the_lectures_module_shows_each_projection_on_its_side():
    m = MultiHeadAttention(32, 4).double()
    flow = data_flow(m, (torch.randn(2, 6, 32, dtype=torch.float64),), {})
    assert _named(m, flow.sides()) == {"q": ["W_q.bias", "W_q.weight"], "k": ["W_k.bias", "W_k.weight"],
                                       "v": ["W_v.bias", "W_v.weight"], "o": ["W_o.bias", "W_o.weight"]}


class Swapped(nn.Module):
    """k written first in the einsum, and names that say nothing: the key side is the one that
    gives the scores their last axis, whatever the order of the operands."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(16, 16, bias=False) for _ in range(4))

    def forward(self, x):
        q, k, v = (t(x).view(2, 5, 2, 8).transpose(1, 2) for t in (self.b, self.c, self.a))
        scores = torch.einsum("bhkd,bhqd->bhqk", k, q) / 8 ** 0.5
        return self.d((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 5, 16))


def test_the_key_side_is_the_one_that_gives_the_last_axis():
    m = Swapped()
    sides = _named(m, data_flow(m, (torch.randn(2, 5, 16),), {}).sides())
    assert sides == {"q": ["b.weight"], "k": ["c.weight"], "v": ["a.weight"], "o": ["d.weight"]}


class Fused(nn.Module):
    """One fused projection and PyTorch's fused attention: q, k and v are SDPA's arguments."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)

    def forward(self, x):
        q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        return self.out(F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, 5, 16))


def test_a_fused_kernel_shows_its_sides_through_its_arguments():
    m = Fused()
    sides = _named(m, data_flow(m, (torch.randn(2, 5, 16),), {}).sides())
    assert sides["q"] == sides["k"] == sides["v"] == ["qkv.bias", "qkv.weight"]
    assert sides["o"] == ["out.bias", "out.weight"]


def test_a_forward_without_attention_shows_none():
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    assert data_flow(m, (torch.randn(2, 8),), {}).sides() == {}
