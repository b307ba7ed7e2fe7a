"""The classic mistakes, each the lecture's computation with one stage done wrong: a student's
output that equals one of them is diagnosed as that mistake, and shown its one-sentence fix.

The lecture's forward is written here as stages (project, split, QK-norm, RoPE, scores, scale,
ALiBi's bias, soft cap, mask, softmax (with its sink), weights·V, merge, output); a mistake replaces one or two of them. `needs` says when a
mistake can show at all (a mask, none, RoPE, biases, T = d_k for Q @ K to run)."""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from mha_trace.core.attention import alibi_bias, relative_bucket, rotate_half

INF = float("-inf")


@dataclass(frozen=True)
class Mistake:
    name: str  # what the student's module does instead
    fix: str  # one sentence
    stages: dict = field(default_factory=dict)  # stage -> its wrong version
    needs: tuple = ()  # "mask", "no mask", "rope", "partial", "bias", "T = d_k", "qk_norm", "softcap", "sinks"
    at: tuple = ()  # (op, rank) of the student's step to name, where the first different value is not it


def _rope(x, base, sign=1.0, over=None):
    """RoPE as the lecture's module turns (B, H, T, d) (sign -1: the other way round; `over`: the
    frequencies over that many dims instead of d)."""
    T, d = x.size(-2), x.size(-1)
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / (over or d))
    angles = torch.cat([torch.arange(T, dtype=x.dtype)[:, None] * inv_freq] * 2, dim=-1)
    return x * angles.cos() + sign * rotate_half(x) * angles.sin()


def _turned(m, t, sign=1.0, over=None, last=False):
    """t turned as the module turns it: its first rope_dims dims (partial RoPE; `last`: its last
    ones), or all of them, the rest passed through."""
    dims = m.rope_dims or t.size(-1)
    if dims == t.size(-1):
        return _rope(t, m.rope_base, sign, over)
    if last:
        return torch.cat([t[..., :-dims], _rope(t[..., -dims:], m.rope_base, sign, over)], dim=-1)
    return torch.cat([_rope(t[..., :dims], m.rope_base, sign, over), t[..., dims:]], dim=-1)


def _split(m, t):
    return t.view(t.size(0), -1, t.size(-1) // m.d_k, m.d_k).transpose(1, 2)  # K, V: kv_heads


def _merge(m, c):
    return c.transpose(1, 2).reshape(c.size(0), -1, m.d_model)


def _softmax_twice(s):
    return torch.softmax(torch.softmax(s, -1), -1)


def _softmax(m, s, sink_scale: float = 1.0):
    """Over the keys, and with the module's sink (times sink_scale) as one more column, dropped."""
    if m.sinks is None:
        return torch.softmax(s, dim=-1)
    sink = (m.sink * sink_scale).view(1, -1, 1, 1).expand(s.size(0), -1, s.size(2), 1)
    return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]


def _rms(t, gain, dims):
    """RMSNorm over `dims` (the lecture's: a head's d_k, -1), eps as the module's, then the gain."""
    return t / torch.sqrt(t.pow(2).mean(dim=dims, keepdim=True) + 1e-6) * gain


def _relative(m, s, reversed_offset: bool = False):
    """The scores plus T5's bias as the module adds it (`reversed_offset`: bucketed by i - j)."""
    i, j = torch.arange(s.size(-2))[:, None], torch.arange(s.size(-1))[None, :]
    return s + m.rel_bias(relative_bucket(i - j if reversed_offset else j - i)).permute(2, 0, 1)


def _alibi(m, s, sign: float = 1.0, slopes_reversed: bool = False):
    """The scores plus the module's position bias: ALiBi's (the sign or the slopes' order as given)
    or T5's."""
    if m.relative_bias:
        return _relative(m, s)
    if not m.alibi:
        return s
    bias = alibi_bias(m.heads, 0, s.size(-2), s.size(-1), s.dtype, s.device)
    return s + sign * (bias.flip(0) if slopes_reversed else bias)


def _cap(m, s):
    return s if m.softcap is None else m.softcap * torch.tanh(s / m.softcap)


LECTURE = {  # the stages of the lecture's forward: (m, ...) -> ...
    "project": lambda m, x, layer: F.linear(x, layer.weight, layer.bias),
    "layers": lambda m: (m.W_q, m.W_k, m.W_v),
    "split": _split,
    "norm": lambda m, Q, K: (m.q_norm(Q), m.k_norm(K)) if m.qk_norm else (Q, K),
    "rope": lambda m, Q, K, V: (_turned(m, Q), _turned(m, K), V) if m.rope else (Q, K, V),
    "scores": lambda m, Q, K: Q @ K.transpose(-2, -1),
    "scale": lambda m, s: s / m.d_k ** 0.5,
    "bias": _alibi,
    "cap": _cap,
    "mask": lambda m, s, mask: s if mask is None else s.masked_fill(~mask, INF),
    "softmax": _softmax,
    "after softmax": lambda m, w, mask: w,
    "mix": lambda m, w, s, K, V: w @ V,
    "merge": _merge,
    "output": lambda m, c, x: F.linear(c, m.W_o.weight, m.W_o.bias),
}

SOFTMAX_FIX = "take the softmax over the keys, the last axis: torch.softmax(scores, dim=-1)"
MISTAKES = (
    Mistake("scaled by d_k instead of √d_k", "divide the scores by math.sqrt(d_k), not by d_k",
            {"scale": lambda m, s: s / m.d_k}),
    Mistake("not scaled at all", "divide the scores by √d_k before the softmax",
            {"scale": lambda m, s: s}),
    Mistake("scaled by √d_model instead of √d_k", "scale by the width of one head: √d_k, "
            "with d_k = d_model / heads", {"scale": lambda m, s: s / m.d_model ** 0.5}),
    Mistake("scaled after the softmax", "divide the scores, not the weights, by √d_k: the scale "
            "goes before the softmax", {"scale": lambda m, s: s,
                                       "after softmax": lambda m, w, mask: w / m.d_k ** 0.5}),
    Mistake("softmax over the queries instead of the keys", SOFTMAX_FIX,
            {"softmax": lambda m, s: torch.softmax(s, dim=-2)}),
    Mistake("softmax over the heads instead of the keys", SOFTMAX_FIX,
            {"softmax": lambda m, s: torch.softmax(s, dim=1)}),
    Mistake("softmax over the batch instead of the keys", SOFTMAX_FIX,
            {"softmax": lambda m, s: torch.softmax(s, dim=0)}),
    Mistake("softmax applied twice", "apply the softmax once: its weights already sum to 1",
            {"softmax": lambda m, s: _softmax_twice(s)}),
    Mistake("the raw scores mix V (the softmax's weights are not used)", "multiply V by the "
            "softmax's weights: context = weights @ V", {"mix": lambda m, w, s, K, V: s @ V}),
    Mistake("heads merged without transposing back", "transpose(1, 2) back to (B, T, H, d_k) "
            "before reshaping to (B, T, d_model)",
            {"merge": lambda m, c: c.reshape(c.size(0), -1, m.d_model)}),
    Mistake("heads split as view(B, H, T, d_k)", "view as (B, T, H, d_k), then transpose(1, 2): "
            "a head is a block of columns of each token's row, not a block of rows",
            {"split": lambda m, t: t.reshape(t.size(0), m.heads, -1, m.d_k)}),
    Mistake("heads merged with d_k before the heads (permute(0, 2, 3, 1))", "merge with "
            "transpose(1, 2) (B, T, H, d_k): each head's d_k columns stay together",
            {"merge": lambda m, c: c.permute(0, 2, 3, 1).reshape(c.size(0), -1, m.d_model)}),
    Mistake("batch and sequence swapped in the merge ((T, B, d_model), as nn.MultiheadAttention "
            "without batch_first)", "keep the batch first: transpose(1, 2).reshape(B, T, d_model)",
            {"merge": lambda m, c: c.permute(2, 0, 1, 3).reshape(c.size(2), c.size(0), -1)
             .reshape(c.size(0), c.size(2), -1)}),
    Mistake("heads split as view(B, H, T, d_k) and merged back with view(B, T, d_model)",
            "view as (B, T, H, d_k), then transpose(1, 2); merge with transpose(1, 2) back",
            {"split": lambda m, t: t.reshape(t.size(0), m.heads, -1, m.d_k),
             "merge": lambda m, c: c.reshape(c.size(0), -1, m.d_model)}),
    Mistake("one head of width d_model: the heads never split", "split into heads: view(B, T, H, "
            "d_k).transpose(1, 2), so each head has its own weights",
            {"split": lambda m, t: t[:, None], "scale": lambda m, s: s / m.d_model ** 0.5}),
    Mistake("mask inverted", "fill where the mask is False (~mask): True means a query may look",
            {"mask": lambda m, s, mask: s.masked_fill(mask, INF)}, ("mask",)),
    Mistake("mask transposed: queries see later keys, not earlier", "index the mask as "
            "[query, key]: rows are queries; do not transpose it",
            {"mask": lambda m, s, mask: s.masked_fill(~mask.transpose(-2, -1), INF)}, ("mask",)),
    Mistake("mask off by one (a query sees one key ahead)", "use tril() with the diagonal "
            "(offset 0): a query sees itself and what came before",
            {"mask": lambda m, s, mask: s.masked_fill(~torch.ones_like(mask).tril(1), INF)},
            ("mask",)),
    Mistake("mask never applied", "mask the scores before the softmax: "
            "scores.masked_fill(~mask, float('-inf'))", {"mask": lambda m, s, mask: s}, ("mask",)),
    Mistake("masked scores set to 0 instead of -inf", "fill with float('-inf'): a score of 0 "
            "still gets weight after the softmax",
            {"mask": lambda m, s, mask: s.masked_fill(~mask, 0.0)}, ("mask",)),
    Mistake("mask applied after the softmax (rows no longer sum to 1)", "mask the scores before "
            "the softmax, so each row's weights sum to 1",
            {"mask": lambda m, s, mask: s, "after softmax": lambda m, w, mask: w.masked_fill(
                ~mask, 0.0)}, ("mask",)),
    Mistake("a causal mask of its own, though none was asked for", "apply the mask you are "
            "given; none means every query sees every key",
            {"mask": lambda m, s, mask: s.masked_fill(~torch.ones(
                s.shape[-2:], dtype=torch.bool).tril(), INF)}, ("no mask",)),
    Mistake("K not transposed", "compare each query with each key: Q @ K.transpose(-2, -1)",
            {"scores": lambda m, Q, K: Q @ K}, ("T = d_k",)),
    Mistake("scores transposed (K @ Qᵀ)", "Q @ K.transpose(-2, -1): rows are queries, columns "
            "keys", {"scores": lambda m, Q, K: K @ Q.transpose(-2, -1)}),
    Mistake("Q in place of K (scores Q·Qᵀ)", "the scores are Q @ K.transpose(-2, -1)",
            {"scores": lambda m, Q, K: Q @ Q.transpose(-2, -1)}),
    Mistake("weights applied to K instead of V", "mix the values: context = weights @ V",
            {"mix": lambda m, w, s, K, V: w @ K}),
    Mistake("weights transposed before they mix V", "use the weights as the softmax gives them, "
            "(…, query, key): context = weights @ V", {"mix": lambda m, w, s, K, V:
                                                      w.transpose(-2, -1) @ V}),
    Mistake("W_O missing", "project the merged heads with W_O: return W_o(context)",
            {"output": lambda m, c, x: c}),
    Mistake("a residual added inside attention (x + output)", "return the attention's output "
            "alone: the residual connection belongs to the transformer block around it",
            {"output": lambda m, c, x: F.linear(c, m.W_o.weight, m.W_o.bias) + x}),
    Mistake("bias missing", "keep the projections' biases: x @ W.T + b (nn.Linear adds them)",
            {"project": lambda m, x, layer: F.linear(x, layer.weight),
             "output": lambda m, c, x: F.linear(c, m.W_o.weight)}, ("bias",)),
    Mistake("RoPE applied to V too", "rotate Q and K only: V carries what a token says, not where "
            "it is", {"rope": lambda m, Q, K, V: tuple(_turned(m, t) for t in (Q, K, V))},
            ("rope",)),
    Mistake("RoPE applied to Q only", "rotate K too: only then does a score depend on the offset "
            "between the two positions", {"rope": lambda m, Q, K, V: (_turned(m, Q), K, V)},
            ("rope",)),
    Mistake("RoPE turned the wrong way (the sine's sign flipped)", "x·cos θ + rotate_half(x)·sin "
            "θ, with rotate_half(x) = (-x₂, x₁)", {"rope": lambda m, Q, K, V: (
                _turned(m, Q, -1), _turned(m, K, -1), V)}, ("rope",)),
)
PARTIAL_MISTAKES = (  # with --rope --rope-dim R below d_k: partial RoPE done wrong
    Mistake("partial RoPE on the last R dims of each head, not the first", "turn the first R dims and pass "
            "the rest: cat([rope(x[..., :R]), x[..., R:]], dim=-1)",
            {"rope": lambda m, Q, K, V: (_turned(m, Q, last=True), _turned(m, K, last=True), V)}, ("partial",)),
    Mistake("partial RoPE's frequencies over d_k, not over the R dims that turn", "take θ_i = base^(-2i/R) "
            "over the rotary dims (Phi's rotary_emb is built with dim = R)",
            {"rope": lambda m, Q, K, V: (_turned(m, Q, over=m.d_k), _turned(m, K, over=m.d_k), V)}, ("partial",)),
    Mistake("every dim of each head turned, not the first R", "turn only x[..., :R] and pass the other "
            "d_k - R dims through unchanged",
            {"rope": lambda m, Q, K, V: (_rope(Q, m.rope_base), _rope(K, m.rope_base), V)}, ("partial",)),
)
SCORING_MISTAKES = (  # with --softcap, --qk-norm, --sink-logits or --off-by-one: the variant done wrong
    Mistake("soft cap applied after the softmax", "cap the scores, before the softmax: "
            "scores = c * torch.tanh(scores / c)", {"cap": lambda m, s: s, "after softmax": lambda m, w, mask:
                                                   m.softcap * torch.tanh(w / m.softcap)}, ("softcap",), ("tanh", 4)),
    Mistake("soft cap without its c (tanh(s), not c·tanh(s / c))", "divide by c inside the tanh and "
            "multiply by c outside: c * torch.tanh(scores / c)", {"cap": lambda m, s: torch.tanh(s)}, ("softcap",)),
    Mistake("soft cap without the c outside (tanh(s / c))", "multiply the tanh by c again: "
            "c * torch.tanh(scores / c), so small scores pass unchanged",
            {"cap": lambda m, s: torch.tanh(s / m.softcap)}, ("softcap",)),
    Mistake("soft cap before the scale by √d_k", "scale first, then cap: c * torch.tanh((q·k / √d_k) / c)",
            {"scale": lambda m, s: _cap(m, s) / m.d_k ** 0.5, "cap": lambda m, s: s}, ("softcap",)),
    Mistake("soft cap after the mask (masked keys come back at -c)", "cap before masking: tanh turns "
            "-inf into -c, a score the softmax gives weight", {"cap": lambda m, s: s, "mask": lambda m, s, mask:
                                                               _cap(m, s if mask is None else s.masked_fill(~mask, INF))},
            ("softcap", "mask")),
    Mistake("ALiBi's bias with the wrong sign (far keys favoured)", "subtract the distance: add "
            "-m·|i - j|, so the farther the key, the lower its score", {"bias": lambda m, s: _alibi(m, s, -1.0)},
            ("alibi",)),
    Mistake("ALiBi's slopes in reverse order (the last head the steepest)", "head h's slope is "
            "2^(-8h/H): head 1 the steepest, each next one half as steep (for 8 heads)",
            {"bias": lambda m, s: _alibi(m, s, slopes_reversed=True)}, ("alibi",)),
    Mistake("ALiBi's bias divided by √d_k too", "add the bias after the scale: it is not a dot "
            "product", {"scale": lambda m, s: _alibi(m, s) / m.d_k ** 0.5, "bias": lambda m, s: s}, ("alibi",),
            ("sub", 4)),
    Mistake("T5's bias bucketed by i - j, not j - i (keys before and after the query swapped)", "bucket the "
            "key's offset from the query, j - i: memory_position - context_position, as T5 does",
            {"bias": lambda m, s: _relative(m, s, reversed_offset=True)}, ("relative_bias",)),
    Mistake("T5's bias divided by √d_k too", "add the bias after the scale: it is a learned number, not a dot "
            "product", {"scale": lambda m, s: _relative(m, s) / m.d_k ** 0.5, "bias": lambda m, s: s},
            ("relative_bias",), ("div", 4)),
    Mistake("QK-norm over the sequence instead of each head's d_k", "normalise each q and k vector: "
            "an RMSNorm over the last axis, d_k", {"norm": lambda m, Q, K: (
                _rms(Q, m.q_norm.weight, -2), _rms(K, m.k_norm.weight, -2))}, ("qk_norm",)),
    Mistake("QK-norm over the whole projection, every head at once (OLMo 2's), not each head's d_k "
            "(Qwen3's, which --qk-norm checks)", "split into heads first, then RMSNorm over each head's d_k",
            {"norm": lambda m, Q, K: (_rms(Q, m.q_norm.weight, (1, 3)), _rms(K, m.k_norm.weight, (1, 3)))},
            ("qk_norm",)),
    Mistake("QK-norm's eps left at F.rms_norm's default (the dtype's machine epsilon), not 1e-6",
            "pass eps=1e-6, as Qwen3 does: F.rms_norm(q, (d_k,), eps=1e-6)", {"norm": lambda m, Q, K: (
                F.rms_norm(Q, (m.d_k,), m.q_norm.weight), F.rms_norm(K, (m.d_k,), m.k_norm.weight))},
            ("qk_norm",), ("rms_norm", 4)),
    Mistake("QK-norm on q only", "normalise k too: only then is every score bounded",
            {"norm": lambda m, Q, K: (m.q_norm(Q), K)}, ("qk_norm",)),
    Mistake("the sink never joins the softmax", "add the sink's logit as one more column of each "
            "row, softmax, then drop that column: softmax(cat([scores, sink]))[..., :-1]",
            {"softmax": lambda m, s: torch.softmax(s, dim=-1)}, ("sinks",)),
    Mistake("the sink's logit divided by √d_k too", "join the sink after the scale: it is a logit "
            "of its own, not a dot product", {"softmax": lambda m, s: _softmax(m, s, m.d_k ** -0.5)}, ("sinks",)),
)
DIFF = {  # differential attention's stages (core.attention's differential and what follows it)
    "scale": lambda m, s: s / (m.d_k // 2) ** 0.5,
    "lam": lambda m: m.lam(),
    "combine": lambda m, first, second, lam: first - lam * second,
    "head norm": lambda m, c: (1 - m.lambda_init) * m.head_norm(c),
}
DIFF_MISTAKES = (  # with --diff
    Mistake("λ not re-parametrised (λ_q1·λ_k1 - λ_q2·λ_k2 + λ_init, without the exps)", "λ = exp(λ_q1·λ_k1) - "
            "exp(λ_q2·λ_k2) + λ_init: the exps keep λ learning at the pace of q and k",
            {"lam": lambda m: torch.dot(m.lambda_q1, m.lambda_k1) - torch.dot(m.lambda_q2, m.lambda_k2)
             + m.lambda_init}, ("diff",), ("add", 0)),
    Mistake("the second map added, not taken away", "subtract it: softmax₁ - λ·softmax₂, so what both maps "
            "share cancels", {"combine": lambda m, first, second, lam: first + lam * second}, ("diff",), ("add", 4)),
    Mistake("each head's output not normed", "RMS-norm each head's Σ w·v over its d_k dims before the heads "
            "are joined", {"head norm": lambda m, c: (1 - m.lambda_init) * c}, ("diff",)),
    Mistake("each head's output not scaled by 1 - λ_init", "multiply the normed head by (1 - λ_init), so its "
            "scale matches plain attention's at the start of training", {"head norm": lambda m, c: m.head_norm(c)},
            ("diff",), ("rms_norm", 4)),
    Mistake("each map scaled by √d_k, not √(d_k / 2)", "a map's q and k are half a head: scale by the width "
            "they have, math.sqrt(d_k // 2)", {"scale": lambda m, s: s / m.d_k ** 0.5}, ("diff",)),
)


KNOWN = MISTAKES + PARTIAL_MISTAKES + SCORING_MISTAKES + DIFF_MISTAKES
BUGS = tuple(m.name for m in KNOWN)
FIXES = {m.name: m.fix for m in KNOWN}
SHOWN_AT = {m.name: m.at for m in KNOWN if m.at}
BOTH = "; and "  # two mistakes at once: "scaled by d_k instead of √d_k; and softmax over the ..."


def fix_of(diagnosis: str | None) -> str | None:
    """A diagnosis's fix: one mistake's sentence, or for two at once each one's, in turn."""
    names = (diagnosis or "").split(BOTH)
    return "; then ".join(FIXES[n] for n in names) if all(n in FIXES for n in names) else None
