"""A zoo of real attention bugs: each is a student's module with one line (or two) written wrong,
the mistake verify must name, the line it must point at, and where one exists the title of the
public bug report or forum question the mistake comes from.

`module(entry)` writes the student's source: the template below with the entry's lines in place.
The line the verdict must name is the one marked `# <- the mistake`. Sources are titles of real
threads (checked); a mistake without one has none rather than a made-up one.
"""

from dataclasses import dataclass, field

TEMPLATE = '''import math
import torch
import torch.nn as nn


def rotate(x, base=10000.0, sign=1.0):
    """RoPE on (B, H, T, d): the two halves of each head turned by the token's position."""
    T, d = x.shape[-2], x.shape[-1]
    inv = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    ang = torch.cat([torch.arange(T, dtype=x.dtype)[:, None] * inv] * 2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * ang.cos() + sign * torch.cat((-x2, x1), dim=-1) * ang.sin()


class Attention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k, self.d_model = num_heads, d_model // num_heads, d_model
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, _ = x.shape
        q = {q}
        k = {k}
        v = {v}
{rope}        scores = {scores}
        scores = {scale}
        if mask is not None:
            scores = {mask}
        weights = {softmax}
{after}        context = {mix}
        context = {merge}
        return {output}, weights
'''

LECTURE = {
    "q": "self.W_q(x).view(B, T, self.h, self.d_k).transpose(1, 2)",
    "k": "self.W_k(x).view(B, T, self.h, self.d_k).transpose(1, 2)",
    "v": "self.W_v(x).view(B, T, self.h, self.d_k).transpose(1, 2)",
    "rope": "",
    "scores": "q @ k.transpose(-2, -1)",
    "scale": "scores / math.sqrt(self.d_k)",
    "mask": "scores.masked_fill(~mask, float('-inf'))",
    "softmax": "torch.softmax(scores, dim=-1)",
    "after": "",
    "mix": "weights @ v",
    "merge": "context.transpose(1, 2).reshape(B, T, self.d_model)",
    "output": "self.W_o(context)",
}
ROPE = "        q, k = rotate(q), rotate(k)\n"


@dataclass
class Entry:
    mistake: str  # the diagnosis verify must give
    lines: dict  # template slot -> the student's code
    marked: str  # the slot whose line verify must name
    args: tuple = ()  # verify's options that make the mistake show
    source: str = ""  # the public bug report or question it comes from, by title
    extra: dict = field(default_factory=dict)


CAUSAL = ("--mask", "causal")
ROPE_ARGS = ("--rope",)
ZOO = {
    "scaled_by_dk": Entry("scaled by d_k instead of √d_k", {"scale": "scores / self.d_k"}, "scale"),
    "not_scaled": Entry("not scaled at all", {"scale": "scores"}, "scores"),
    "scaled_by_d_model": Entry("scaled by √d_model instead of √d_k",
                               {"scale": "scores / math.sqrt(self.d_model)"}, "scale"),
    "scaled_after_softmax": Entry("scaled after the softmax", {
        "scale": "scores", "after": "        weights = weights / math.sqrt(self.d_k)\n"}, "scores"),
    "softmax_queries": Entry("softmax over the queries instead of the keys",
                             {"softmax": "torch.softmax(scores, dim=-2)"}, "softmax"),
    "softmax_heads": Entry("softmax over the heads instead of the keys",
                           {"softmax": "torch.softmax(scores, dim=1)"}, "softmax"),
    "softmax_batch": Entry("softmax over the batch instead of the keys",
                           {"softmax": "torch.softmax(scores, dim=0)"}, "softmax"),
    "softmax_twice": Entry("softmax applied twice",
                           {"softmax": "torch.softmax(torch.softmax(scores, dim=-1), dim=-1)"}, "softmax"),
    "raw_scores_mix": Entry("the raw scores mix V (the softmax's weights are not used)",
                            {"mix": "scores @ v"}, "mix"),
    "merge_no_transpose": Entry("heads merged without transposing back",
                                {"merge": "context.reshape(B, T, self.d_model)"}, "merge",
                                source="Fix batch_first paths in DPMultiheadAttention (opacus pull "
                                       "request #825: a .view without the transpose)"),
    "split_view_bhtd": Entry("heads split as view(B, H, T, d_k)", {
        "q": "self.W_q(x).view(B, self.h, T, self.d_k)",
        "k": "self.W_k(x).view(B, self.h, T, self.d_k)",
        "v": "self.W_v(x).view(B, self.h, T, self.d_k)"}, "q"),
    "split_and_merge_view": Entry(
        "heads split as view(B, H, T, d_k) and merged back with view(B, T, d_model)", {
            "q": "self.W_q(x).view(B, self.h, T, self.d_k)",
            "k": "self.W_k(x).view(B, self.h, T, self.d_k)",
            "v": "self.W_v(x).view(B, self.h, T, self.d_k)",
            "merge": "context.reshape(B, T, self.d_model)"}, "q"),
    "merge_permute": Entry("heads merged with d_k before the heads (permute(0, 2, 3, 1))",
                           {"merge": "context.permute(0, 2, 3, 1).reshape(B, T, self.d_model)"},
                           "merge"),
    "merge_seq_first": Entry(
        "batch and sequence swapped in the merge ((T, B, d_model), as nn.MultiheadAttention "
        "without batch_first)", {"merge": "context.permute(2, 0, 1, 3).reshape(T, B, self.d_model).reshape(B, T, self.d_model)"},
        "merge", source="Batched MultiHeadAttention (OmDet issue #19: batch_first "
                                  "not set, wrong only in batch inference)"),
    "never_split": Entry("one head of width d_model: the heads never split", {
        "q": "self.W_q(x)[:, None]", "k": "self.W_k(x)[:, None]", "v": "self.W_v(x)[:, None]",
        "scale": "scores / math.sqrt(self.d_model)"}, "scores"),
    "mask_inverted": Entry("mask inverted", {"mask": "scores.masked_fill(mask, float('-inf'))"},
                           "mask", (*CAUSAL, "--mask-means", "keep"),
                           source="Attention mask definition. (GeMap issue #1: True means not "
                                  "allowed to attend)"),
    "mask_transposed": Entry("mask transposed: queries see later keys, not earlier",
                             {"mask": "scores.masked_fill(~mask.T, float('-inf'))"}, "mask", CAUSAL),
    "mask_off_by_one": Entry("mask off by one (a query sees one key ahead)",
                             {"mask": "scores.masked_fill(~torch.ones_like(mask).tril(1), float('-inf'))"},
                             "mask", CAUSAL),
    "mask_never_applied": Entry("mask never applied", {"mask": "scores"}, "scale", CAUSAL,
                                source="`attn_mask` in nn.MultiheadAttention is additive (pytorch "
                                       "issue #21518: a 0/1 causal mask added, not applied)"),
    "mask_zero": Entry("masked scores set to 0 instead of -inf",
                       {"mask": "scores.masked_fill(~mask, 0.0)"}, "mask", CAUSAL,
                       source="How is the padding mask incorporated in the attention formula? "
                              "(AI Stack Exchange)"),
    "mask_after_softmax": Entry("mask applied after the softmax (rows no longer sum to 1)", {
        "mask": "scores", "after": "        if mask is not None:\n            weights = weights.masked_fill(~mask, 0.0)\n"},
        "scale", CAUSAL),
    "own_causal_mask": Entry("a causal mask of its own, though none was asked for", {
        "mask": "scores", "softmax": "torch.softmax(scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float('-inf')), dim=-1)"},
        "softmax"),
    "k_not_transposed": Entry("K not transposed", {"scores": "q @ k"}, "scores", ("--seq", "16")),
    "scores_transposed": Entry("scores transposed (K @ Qᵀ)", {"scores": "k @ q.transpose(-2, -1)"},
                               "scores"),
    "q_for_k": Entry("Q in place of K (scores Q·Qᵀ)", {"scores": "q @ q.transpose(-2, -1)"}, "scores"),
    "weights_k": Entry("weights applied to K instead of V", {"mix": "weights @ k"}, "mix"),
    "weights_transposed": Entry("weights transposed before they mix V",
                                {"mix": "weights.transpose(-2, -1) @ v"}, "mix"),
    "no_w_o": Entry("W_O missing", {"output": "context"}, "output"),
    "residual_inside": Entry("a residual added inside attention (x + output)",
                             {"output": "x + self.W_o(context)"}, "output"),
    "bias_missing": Entry("bias missing", {
        "q": "(x @ self.W_q.weight.T).view(B, T, self.h, self.d_k).transpose(1, 2)",
        "k": "(x @ self.W_k.weight.T).view(B, T, self.h, self.d_k).transpose(1, 2)",
        "v": "(x @ self.W_v.weight.T).view(B, T, self.h, self.d_k).transpose(1, 2)",
        "output": "context @ self.W_o.weight.T"}, "q"),
    "rope_on_v": Entry("RoPE applied to V too", {"rope": "        q, k, v = rotate(q), rotate(k), rotate(v)\n"},
                       "rope", ROPE_ARGS),
    "rope_wrong_way": Entry("RoPE turned the wrong way (the sine's sign flipped)",
                            {"rope": "        q, k = rotate(q, sign=-1.0), rotate(k, sign=-1.0)\n"},
                            "rope", ROPE_ARGS),
    "rope_q_only": Entry("RoPE applied to Q only", {"rope": "        q = rotate(q)\n"}, "scores",
                         ROPE_ARGS),
}


def module(entry: Entry) -> str:
    lines = {**LECTURE, **({"rope": ROPE} if "--rope" in entry.args else {}), **entry.lines}
    marked = entry.marked
    text = lines[marked]
    if text.endswith("\n"):  # a whole line of its own
        lines[marked] = text.rstrip("\n") + "  # <- the mistake\n"
    else:
        lines[marked] = text + "  # <- the mistake"
    return TEMPLATE.format(**lines)


# Correct modules written the ways students and libraries write them: each must be Right.
FUSED = TEMPLATE.replace('''        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
''', '''        self.qkv = nn.Linear(d_model, 3 * d_model)
''')
TIMM = "self.qkv(x).reshape(B, T, 3, self.h, self.d_k).permute(2, 0, 3, 1, 4).unbind(0)"
CORRECT = {
    "lecture": ({}, TEMPLATE),
    "F.linear with biases": ({
        "q": "F.linear(x, self.W_q.weight, self.W_q.bias).view(B, T, self.h, self.d_k).transpose(1, 2)",
        "k": "F.linear(x, self.W_k.weight, self.W_k.bias).view(B, T, self.h, self.d_k).transpose(1, 2)",
        "v": "F.linear(x, self.W_v.weight, self.W_v.bias).view(B, T, self.h, self.d_k).transpose(1, 2)",
        "output": "F.linear(context, self.W_o.weight, self.W_o.bias)"}, TEMPLATE),
    "einsum projections": ({
        "q": "(torch.einsum('btd,ed->bte', x, self.W_q.weight) + self.W_q.bias).unflatten(-1, (self.h, self.d_k)).transpose(1, 2)",
        "k": "(torch.einsum('btd,ed->bte', x, self.W_k.weight) + self.W_k.bias).unflatten(-1, (self.h, self.d_k)).transpose(1, 2)",
        "v": "(torch.einsum('btd,ed->bte', x, self.W_v.weight) + self.W_v.bias).unflatten(-1, (self.h, self.d_k)).transpose(1, 2)",
        "scores": "torch.einsum('bhqd,bhkd->bhqk', q, k)",
        "mix": "torch.einsum('bhqk,bhkd->bhqd', weights, v)"}, TEMPLATE),
    ".mT and permute": ({
        "q": "self.W_q(x).reshape(B, T, self.h, self.d_k).permute(0, 2, 1, 3)",
        "scores": "q @ k.mT",
        "merge": "context.permute(0, 2, 1, 3).flatten(2)"}, TEMPLATE),
    "pre-scaled Q": ({
        "q": "(self.W_q(x) / math.sqrt(self.d_k)).view(B, T, self.h, self.d_k).transpose(1, 2)",
        "scale": "scores"}, TEMPLATE),
    "additive mask": ({
        "mask": "scores + torch.zeros_like(scores).masked_fill(~mask, float('-inf'))"}, TEMPLATE),
    "SDPA": ({
        "scores": "None", "scale": "None", "mask": "None", "softmax": "None",
        "mix": "F.scaled_dot_product_attention(q, k, v, attn_mask=mask)"}, TEMPLATE),
    "timm reshape/permute/unbind": ({"q": TIMM.replace(".unbind(0)", "[0]"),
                                     "k": TIMM.replace(".unbind(0)", "[1]"),
                                     "v": TIMM.replace(".unbind(0)", "[2]")}, FUSED),
    "fused split": ({"q": "self.qkv(x).chunk(3, dim=-1)[0].view(B, T, self.h, self.d_k).transpose(1, 2)",
                     "k": "self.qkv(x).chunk(3, dim=-1)[1].view(B, T, self.h, self.d_k).transpose(1, 2)",
                     "v": "self.qkv(x).chunk(3, dim=-1)[2].view(B, T, self.h, self.d_k).transpose(1, 2)"},
                    FUSED),
}


def correct_module(style: str) -> str:
    lines, template = CORRECT[style]
    return template.replace("import torch.nn as nn", "import torch.nn as nn\nimport torch.nn.functional as F") \
        .format(**{**LECTURE, **lines})
