"""Students' soft-capping (Gemma 2), QK-norm (Qwen3) and sink logits (gpt-oss), for `verify --module ...
--softcap 2` (--qk-norm, --sink-logits, --off-by-one): each right class, and each with one line wrong."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

CAP = 2.0


class Scored(nn.Module):
    """Plain attention; each variant below overrides one step of it."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.W_q, self.W_k = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)
        self.W_v, self.W_o = nn.Linear(d_model, d_model), nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = (W(x).view(B, T, self.h, self.d_k).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))
        q, k = self.normed(q, k)
        scores = self.scored(q @ k.transpose(-2, -1), mask)
        w = self.weights(scores)
        return self.W_o((w @ v).transpose(1, 2).reshape(B, T, D)), w

    def normed(self, q, k):
        return q, k

    def scored(self, s, mask):
        s = s / math.sqrt(self.d_k)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))

    def weights(self, s):
        return s.softmax(dim=-1)


class SoftCap(Scored):
    def scored(self, s, mask):
        s = CAP * torch.tanh(s / math.sqrt(self.d_k) / CAP)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class CapAfterMask(Scored):
    def scored(self, s, mask):
        s = super().scored(s, mask)
        return CAP * torch.tanh(s / CAP)


class CapWithoutC(Scored):
    def scored(self, s, mask):
        s = torch.tanh(s / math.sqrt(self.d_k))
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class CapBeforeScale(Scored):
    def scored(self, s, mask):
        s = CAP * torch.tanh(s / CAP) / math.sqrt(self.d_k)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class QKNorm(Scored):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.q_norm, self.k_norm = nn.RMSNorm(self.d_k, eps=1e-6), nn.RMSNorm(self.d_k, eps=1e-6)

    def normed(self, q, k):
        return self.q_norm(q), self.k_norm(k)


class NormOverSequence(QKNorm):
    def normed(self, q, k):
        return q / q.pow(2).mean(dim=-2, keepdim=True).add(1e-6).sqrt(), k / k.pow(2).mean(dim=-2, keepdim=True).add(1e-6).sqrt()


class NormQOnly(QKNorm):
    def normed(self, q, k):
        return self.q_norm(q), k


class Sinks(Scored):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.sinks = nn.Parameter(torch.randn(num_heads))

    def weights(self, s):
        sink = self.sinks.view(1, -1, 1, 1).expand(s.size(0), -1, s.size(2), 1)
        return torch.cat([s, sink], dim=-1).softmax(dim=-1)[..., :-1]


class SinkScaled(Sinks):
    def scored(self, s, mask):
        return s if mask is None else s.masked_fill(~mask, float("-inf"))

    def weights(self, s):
        sink = self.sinks.view(1, -1, 1, 1).expand(s.size(0), -1, s.size(2), 1)
        return (torch.cat([s, sink], dim=-1) / math.sqrt(self.d_k)).softmax(dim=-1)[..., :-1]


class OffByOne(Scored):
    def weights(self, s):
        e = torch.exp(s - s.amax(dim=-1, keepdim=True).clamp(min=0))
        return e / (torch.exp(-s.amax(dim=-1, keepdim=True).clamp(min=0)) + e.sum(dim=-1, keepdim=True))


class FunctionalNorm(Scored):
    """QK-norm with F.rms_norm and no gains, eps as Qwen3's."""

    def normed(self, q, k):
        return F.rms_norm(q, (self.d_k,), eps=1e-6), F.rms_norm(k, (self.d_k,), eps=1e-6)


class CapAfterSoftmax(Scored):
    def weights(self, s):
        return CAP * torch.tanh(s.softmax(dim=-1) / CAP)


class CapWithoutOuterC(Scored):
    def scored(self, s, mask):
        s = torch.tanh(s / math.sqrt(self.d_k) / CAP)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class NormWholeProjection(Scored):
    """OLMo 2's QK-norm: over all of q's (and k's) d_model dims at once, before the heads split."""

    def normed(self, q, k):
        whole = lambda t: t / t.pow(2).mean(dim=(1, 3), keepdim=True).add(1e-6).sqrt()
        return whole(q), whole(k)


def slopes(h):
    return 2.0 ** (-8 * torch.arange(1, h + 1, dtype=torch.float64) / h)


class Alibi(Scored):
    def distance(self, T):
        return (torch.arange(T)[:, None] - torch.arange(T)[None, :]).abs()

    def scored(self, s, mask):
        s = s / math.sqrt(self.d_k) - slopes(self.h)[:, None, None] * self.distance(s.size(-1))
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class AlibiFavoursFar(Alibi):
    def scored(self, s, mask):
        s = s / math.sqrt(self.d_k) + slopes(self.h)[:, None, None] * self.distance(s.size(-1))
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class AlibiReversed(Alibi):
    def scored(self, s, mask):
        s = s / math.sqrt(self.d_k) - slopes(self.h).flip(0)[:, None, None] * self.distance(s.size(-1))
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class AlibiBeforeScale(Alibi):
    def scored(self, s, mask):
        s = (s - slopes(self.h)[:, None, None] * self.distance(s.size(-1))) / math.sqrt(self.d_k)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class Differential(Scored):
    """The DIFF Transformer's attention: a map from each half of a head's q and k, λ re-parametrised."""

    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        half = self.d_k // 2
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.randn(half) * 0.1) for _ in range(4))
        self.lambda_init = 0.2
        self.subln = nn.RMSNorm(self.d_k, eps=1e-5, elementwise_affine=False)

    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = (W(x).view(B, T, self.h, self.d_k).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))
        q1, q2 = q.chunk(2, dim=-1)
        k1, k2 = k.chunk(2, dim=-1)
        w1 = self.scored(q1 @ k1.transpose(-2, -1), mask).softmax(dim=-1)
        w2 = self.scored(q2 @ k2.transpose(-2, -1), mask).softmax(dim=-1)
        w = w1 - self.lam() * w2
        out = self.normed_heads(w @ v)
        return self.W_o(out.transpose(1, 2).reshape(B, T, D)), w

    def scored(self, s, mask):
        s = s / math.sqrt(self.d_k // 2)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))

    def lam(self):
        return torch.exp(self.lambda_q1 @ self.lambda_k1) - torch.exp(self.lambda_q2 @ self.lambda_k2) + self.lambda_init

    def normed_heads(self, o):
        return (1 - self.lambda_init) * self.subln(o)


class DiffRawLambda(Differential):
    def lam(self):
        return self.lambda_q1 @ self.lambda_k1 - self.lambda_q2 @ self.lambda_k2 + self.lambda_init


class DiffNoNorm(Differential):
    def normed_heads(self, o):
        return (1 - self.lambda_init) * o


class DiffScaledByDk(Differential):
    def scored(self, s, mask):
        s = s / math.sqrt(self.d_k)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class DiffSecondAdded(Differential):
    def forward(self, x, mask=None):
        B, T, D = x.shape
        q, k, v = (W(x).view(B, T, self.h, self.d_k).transpose(1, 2) for W in (self.W_q, self.W_k, self.W_v))
        q1, q2 = q.chunk(2, dim=-1)
        k1, k2 = k.chunk(2, dim=-1)
        w1 = self.scored(q1 @ k1.transpose(-2, -1), mask).softmax(dim=-1)
        w2 = self.scored(q2 @ k2.transpose(-2, -1), mask).softmax(dim=-1)
        w = w1 + self.lam() * w2
        out = self.normed_heads(w @ v)
        return self.W_o(out.transpose(1, 2).reshape(B, T, D)), w


class DiffNotScaled(Differential):
    def normed_heads(self, o):
        return self.subln(o)


class DefaultEps(Scored):
    def normed(self, q, k):
        return F.rms_norm(q, (self.d_k,)), F.rms_norm(k, (self.d_k,))


R = 4  # partial RoPE (Phi's): the first R dims of each head turn, the rest pass through


def turned(x, over=None, base=10000.0):
    """Rotate-half RoPE on x (B, H, T, d), its frequencies over `over` dims (d when None)."""
    T, d = x.size(-2), x.size(-1)
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=x.dtype) / (over or d))
    angles = torch.cat([torch.arange(T, dtype=x.dtype)[:, None] * inv_freq] * 2, dim=-1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * angles.cos() + torch.cat([-x2, x1], dim=-1) * angles.sin()


class PartialRope(Scored):
    def normed(self, q, k):
        return tuple(torch.cat([turned(t[..., :R]), t[..., R:]], dim=-1) for t in (q, k))


class PartialRopeLastDims(Scored):
    def normed(self, q, k):
        return tuple(torch.cat([t[..., :-R], turned(t[..., -R:])], dim=-1) for t in (q, k))


class PartialRopeFrequencies(Scored):
    def normed(self, q, k):
        return tuple(torch.cat([turned(t[..., :R], over=self.d_k), t[..., R:]], dim=-1) for t in (q, k))


class PartialRopeWhole(Scored):
    def normed(self, q, k):
        return turned(q), turned(k)


def bucket(offset, buckets=32, max_distance=128):
    """T5's _relative_position_bucket, bidirectional: the bucket of each key's offset from its query."""
    half = buckets // 2
    ret = (offset > 0).long() * half
    n, exact = offset.abs(), half // 2
    large = exact + (torch.log(n.float() / exact) / math.log(max_distance / exact) * (half - exact)).long()
    return ret + torch.where(n < exact, n, torch.clamp(large, max=half - 1))


class T5Bias(Scored):
    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.relative_attention_bias = nn.Embedding(32, num_heads)

    def position_bias(self, T):
        pos = torch.arange(T)
        return self.relative_attention_bias(bucket(pos[None, :] - pos[:, None])).permute(2, 0, 1)

    def scored(self, s, mask):
        s = s / math.sqrt(self.d_k) + self.position_bias(s.size(-1))
        return s if mask is None else s.masked_fill(~mask, float("-inf"))


class T5BiasReversed(T5Bias):
    def position_bias(self, T):
        pos = torch.arange(T)
        return self.relative_attention_bias(bucket(pos[:, None] - pos[None, :])).permute(2, 0, 1)


class T5BiasScaled(T5Bias):
    def scored(self, s, mask):
        s = (s + self.position_bias(s.size(-1))) / math.sqrt(self.d_k)
        return s if mask is None else s.masked_fill(~mask, float("-inf"))
