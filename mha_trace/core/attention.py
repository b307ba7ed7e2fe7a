"""Multi-head attention, written out the way the lecture notes write it.

Nothing in this file knows about tracing or printing: the tracer watches it from outside.

>>> mha = MultiHeadAttention(d_model=512, heads=8)
>>> out, weights = mha(torch.randn(2, 10, 512))
>>> out.shape, weights.shape
(torch.Size([2, 10, 512]), torch.Size([2, 8, 10, 10]))

The options modern models use are plain switches, nanoGPT-style: `rope` (rotary positions, as
LLaMA), `window` (sliding window, as Mistral), `impl="sdpa"` (the fused kernel) or `"tiled"`
(FlashAttention-2's loop, written out) and a `KVCache` for decoding one token at a time; and on
the scores, `qk_norm` (Qwen3, OLMo 2), `alibi` (BLOOM), `softcap` (Gemma 2) and `sinks` (gpt-oss's
learned logit a head, or the off-by-one softmax's fixed 0); and `diff` (differential attention).
"""

import math
import threading

import torch
import torch.nn as nn
import torch.nn.functional as F


def rotate_half(x):
    """(x1, x2) -> (-x2, x1) on the two halves of the last dim: RoPE's pairing (LLaMA)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope(x, start, base, dims=None):
    """Rotate each pair (x_i, x_{i+d/2}) of x (B, H, T, d) by angle position · base^(-2i/d).
    start: the first token's position, an int or a 0-dim tensor (a cache's, on the device).
    dims: turn only the first `dims` of d, the rest passed through (partial RoPE, as Phi)."""
    if dims is not None and dims < x.size(-1):
        return torch.cat([rope(x[..., :dims], start, base), x[..., dims:]], dim=-1)
    cos, sin = rope_angles(start, x.size(-2), x.size(-1), base, x.dtype, x.device)  # (T, d) each
    return x * cos + rotate_half(x) * sin


_last_angles = threading.local()


def rope_angles(start, T, d, base, dtype, device):
    """cos and sin (T, d) of each position's angles, position · base^(-2i/d) (in float64 for
    float64 x). A tensor start (a cache's position, one for every layer) keeps the last ones it
    was asked for until it changes in place: every layer of a decoding step turns q and k by the
    same positions, so a step computes them once."""
    key = None if isinstance(start, int) else (id(start), start._version, T, d, base, dtype, device)
    kept = getattr(_last_angles, "kept", None)
    if key is not None and kept is not None and kept[0] == key:
        return kept[2], kept[3]
    exact = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=exact, device=device) / d)  # (d/2,)
    positions = start + torch.arange(T, dtype=exact, device=device)  # (T,)
    angles = torch.cat([positions[:, None] * inv_freq] * 2, dim=-1)  # (T, d)
    cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
    if key is not None:  # start held with them: no other tensor takes its id meanwhile
        _last_angles.kept = (key, start, cos, sin)
    return cos, sin


def alibi_slopes(heads):
    """ALiBi's slope a head (Press et al. 2022): 2^(-8h/H), h = 1..H, for H a power of 2; else the
    nearest power's slopes, then every other one of twice that many heads' (as BLOOM builds them)."""
    n = 2 ** math.floor(math.log2(heads))
    extra = [2 ** (-4 * (2 * h + 1) / n) for h in range(heads - n)]
    return torch.tensor([2 ** (-8 * (h + 1) / n) for h in range(n)] + extra)  # (H,)


def relative_bucket(offset, buckets=32, max_distance=128):
    """T5's bucket of each key's offset j - i (bidirectional, as its encoder): half the buckets for
    keys before the query and half for keys after; in each half, offsets below a quarter of the
    buckets one bucket each, larger ones in log-spaced buckets up to max_distance, the rest in the last."""
    half = buckets // 2
    bucket = (offset > 0).long() * half  # keys after the query: the second half
    distance, exact = offset.abs(), half // 2
    far = exact + (torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (half - exact)).long()
    return bucket + torch.where(distance < exact, distance, far.clamp(max=half - 1))


def alibi_bias(heads, start, T, T_keys, dtype, device):
    """-m_h · |i - j| for query i (from position `start`) and key j: (H, T, T_keys)."""
    i = start + torch.arange(T, device=device)[:, None]
    j = torch.arange(T_keys, device=device)[None, :]
    return -alibi_slopes(heads).to(device=device, dtype=dtype)[:, None, None] * (i - j).abs()


class KVCache:
    """The keys and values of the tokens seen so far; it grows by concatenation, one step at a time."""

    def __init__(self):
        self.k = self.v = None

    def __len__(self):
        return 0 if self.k is None else self.k.size(2)

    @property
    def position(self):
        """The next token's position: how many tokens the cache has seen."""
        return len(self)

    def append(self, k, v):
        """Add this step's keys and values (B, Hkv, T_new, d_k); return all of them so far."""
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)  # (B, Hkv, T_past + T_new, d_k)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


class MultiHeadAttention(nn.Module):
    """Concat(head_1, ..., head_H) W_O, with head_i = softmax(Q_i K_i^T / sqrt(d_k)) V_i.

    kv_heads < heads shares each K/V head between heads // kv_heads query heads
    (grouped-query attention; kv_heads=1 is multi-query attention).
    """

    def __init__(self, d_model, heads, kv_heads=None, bias=True, rope=False, rope_base=10000.0,
                 window=None, impl="explicit", block_q=None, block_k=None, qk_norm=False,
                 softcap=None, sinks=None, alibi=False, diff=False, rope_dims=None, relative_bias=False):
        super().__init__()
        kv_heads = kv_heads or heads
        self.d_model = d_model
        self.heads = heads
        self.kv_heads = kv_heads
        self.d_k = d_model // heads
        self.rope, self.rope_base = rope, rope_base  # rotary positions on Q and K
        self.rope_dims = rope_dims  # partial RoPE: only each head's first rope_dims dims turn (None: all)
        self.window = window  # a query sees at most `window` keys, itself included
        self.impl, self.block_q, self.block_k = impl, block_q, block_k  # "explicit" | "sdpa" | "tiled"
        self.softcap = softcap  # scores squashed into (-softcap, softcap) before the softmax
        self.alibi = alibi  # a bias falling linearly with the query-key distance, a slope a head
        self.relative_bias = relative_bias  # T5: a learned bias a head for each bucket of the query-key offset
        if relative_bias:
            self.rel_bias = nn.Embedding(32, heads)  # (buckets, H), T5's relative_attention_bias

        # four linear layers: Q, K, V projections (K and V smaller under GQA) and the output mix
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, kv_heads * self.d_k, bias=bias)
        self.W_v = nn.Linear(d_model, kv_heads * self.d_k, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)

        # QK-norm: an RMSNorm over each head's d_k dims of q and of k, before q·k (Qwen3)
        self.qk_norm = qk_norm
        if qk_norm:
            self.q_norm = nn.RMSNorm(self.d_k, eps=1e-6)
            self.k_norm = nn.RMSNorm(self.d_k, eps=1e-6)

        # differential attention (DIFF Transformer): two maps a head from the halves of its q and k,
        # the second taken away λ times; λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init
        self.diff = diff
        if diff:
            half = self.d_k // 2
            self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
                nn.Parameter(torch.randn(half) * 0.1) for _ in range(4))  # (d_k/2,) each
            self.lambda_init = 0.2  # 0.8 - 0.6·exp(-0.3·(l - 1)) for the first layer, l = 1
            self.head_norm = nn.RMSNorm(self.d_k, eps=1e-5, elementwise_affine=False)

        # a sink: one more logit a head that no key stands behind, so a query may attend to nothing
        self.sinks = sinks  # None | "learned" (gpt-oss: a parameter a head) | "zero" (off-by-one softmax)
        if sinks == "learned":
            self.sink = nn.Parameter(torch.randn(heads))  # (H,)
        elif sinks == "zero":
            self.register_buffer("sink", torch.zeros(heads), persistent=False)  # (H,) fixed at 0

    def forward(self, q, k=None, v=None, mask=None, cache=None):
        """q, k, v: (B, T, d_model); k and v default to q. mask: bool, True where a query may look.
        cache: a KVCache when decoding; this call's tokens come after the ones it holds.

        Returns the output (B, T, d_model) and the per-head weights (B, H, T, T_keys), or None
        for the weights with impl="sdpa" or "tiled".
        """
        k = q if k is None else k
        v = q if v is None else v
        B = q.size(0)
        start = 0 if cache is None else cache.position  # position of this call's first token

        # project, then split d_model into heads and move heads next to batch
        Q = self.W_q(q).view(B, -1, self.heads, self.d_k).transpose(1, 2)  # (B, H, T, d_k)
        K = self.W_k(k).view(B, -1, self.kv_heads, self.d_k).transpose(1, 2)  # (B, Hkv, T, d_k)
        V = self.W_v(v).view(B, -1, self.kv_heads, self.d_k).transpose(1, 2)  # (B, Hkv, T, d_k)

        # QK-norm: each head's q and k scaled to unit RMS (times a learned gain), so q·k stays bounded
        if self.qk_norm:
            Q = self.q_norm(Q)  # (B, H, T, d_k)
            K = self.k_norm(K)  # (B, Hkv, T, d_k)

        # differential attention: each head's q and k as two halves, one map each
        if self.diff:
            Q = Q.unflatten(-1, (2, -1)).transpose(2, 3)  # (B, H, 2, T, d_k/2)
            K = K.unflatten(-1, (2, -1)).transpose(2, 3)  # (B, Hkv, 2, T, d_k/2)

        # rotary positions: turn Q and K by their token's position (relative positions survive q·k)
        if self.rope:
            Q = rope(Q, start, self.rope_base, self.rope_dims)  # (B, H, T, d_k)
            K = rope(K, start, self.rope_base, self.rope_dims)  # (B, Hkv, T, d_k)

        # decoding: keep this step's K and V, attend to everything kept so far
        if cache is not None:
            K, V = cache.append(K, V)  # (B, Hkv, T_keys, d_k)

        # sliding window: query i sees keys i - window + 1 .. i
        if self.window is not None:
            i = start + torch.arange(Q.size(2), device=Q.device)[:, None]
            j = torch.arange(K.size(2), device=Q.device)[None, :]
            band = (j <= i) & (j > i - self.window)  # (T, T_keys)
            mask = band if mask is None else mask & band

        if self.impl == "sdpa":
            # one fused call: the (B, H, T, T_keys) scores and weights are never formed
            context = F.scaled_dot_product_attention(Q, K, V, attn_mask=mask,
                                                     enable_gqa=self.kv_heads != self.heads)
            weights = None
        elif self.impl == "tiled":
            # FlashAttention-2's loop: tile by tile, the weights are never formed either
            if self.kv_heads != self.heads:
                K = K.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, T_keys, d_k)
                V = V.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, T_keys, d_k)
            context, _ = tiled_attention(Q, K, V, mask, self.block_q, self.block_k)  # (B, H, T, d_k)
            weights = None
        elif self.diff:
            # differential attention: the difference of two maps mixes V, then each head is normed
            if self.kv_heads != self.heads:
                K = K.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, 2, T_keys, d_k/2)
                V = V.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, T_keys, d_k)
            weights = self.differential(Q, K, mask)  # (B, H, T, T_keys)
            context = (1 - self.lambda_init) * self.head_norm(torch.matmul(weights, V))  # (B, H, T, d_k)
        else:
            # grouped-query attention: each K/V head serves heads // kv_heads query heads
            if self.kv_heads != self.heads:
                K = K.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, T_keys, d_k)
                V = V.repeat_interleave(self.heads // self.kv_heads, dim=1)  # (B, H, T_keys, d_k)

            # scaled dot-product attention, all heads at once
            scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)  # (B, H, T, T_keys)
            if self.alibi:
                # ALiBi (BLOOM): each head's scores fall by its slope m_h per token of distance
                scores = scores + alibi_bias(self.heads, start, Q.size(2), K.size(2), Q.dtype, Q.device)
            if self.relative_bias:
                # a relative position bias (T5): each head's learned number for the bucket of j - i
                scores = scores + self.position_bias(start, Q.size(2), K.size(2))  # (B, H, T, T_keys)
            if self.softcap is not None:
                # soft-capping (Gemma 2): c·tanh(s / c) keeps every score inside (-c, c)
                scores = self.softcap * torch.tanh(scores / self.softcap)  # (B, H, T, T_keys)
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            if self.sinks is not None:
                # the sink's logit joins each row's softmax as one more column, then is dropped
                sink = self.sink.view(1, -1, 1, 1).expand(B, -1, scores.size(2), 1)  # (B, H, T, 1)
                weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, T, T_keys)
            else:
                weights = torch.softmax(scores, dim=-1)  # (B, H, T, T_keys)
            if mask is not None:
                # a query row with every key masked has nothing to look at: weight 0, not NaN
                weights = weights.masked_fill(~mask, 0.0)
            context = torch.matmul(weights, V)  # (B, H, T, d_k)

        # concatenate heads: back to (B, T, H, d_k), copy to one block, merge H and d_k
        context = context.transpose(1, 2).contiguous().view(B, -1, self.d_model)  # (B, T, d_model)

        # output projection: mixes information across heads
        return self.W_o(context), weights

    def position_bias(self, start, T, T_keys):
        """T5's bias (H, T, T_keys): for query i (from position `start`) and key j, the learned
        number of each head for the bucket of the offset j - i."""
        i = start + torch.arange(T, device=self.rel_bias.weight.device)[:, None]
        j = torch.arange(T_keys, device=self.rel_bias.weight.device)[None, :]
        return self.rel_bias(relative_bucket(j - i)).permute(2, 0, 1)  # (H, T, T_keys)

    def differential(self, Q, K, mask):
        """softmax(Q1 K1ᵀ / √d) - λ·softmax(Q2 K2ᵀ / √d), d = d_k / 2 (Ye et al. 2025): noise both maps
        share cancels. Q (B, H, 2, T, d), K (B, H, 2, T_keys, d). Rows sum to 1 - λ."""
        scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(Q.size(-1))  # (B, H, 2, T, T_keys)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        maps = torch.softmax(scores, dim=-1)  # (B, H, 2, T, T_keys)
        weights = maps[:, :, 0] - self.lam() * maps[:, :, 1]  # (B, H, T, T_keys)
        return weights if mask is None else weights.masked_fill(~mask, 0.0)  # a row with no key: 0

    def lam(self):
        """λ = exp(λ_q1·λ_k1) - exp(λ_q2·λ_k2) + λ_init: re-parametrised, so it learns in step with q and k."""
        lam_1 = torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
        lam_2 = torch.exp(torch.dot(self.lambda_q2, self.lambda_k2))
        return lam_1 - lam_2 + self.lambda_init


def tiled_attention(Q, K, V, mask=None, block_q=None, block_k=None):
    """FlashAttention-2's forward (Dao 2023, Algorithm 1): each query tile meets the key/value tiles
    one by one, keeping a running max m, a running sum ℓ and an unnormalised output, so the
    (T, T_keys) scores are never formed. Q (B, H, T, d_k); K, V (B, H, T_keys, d_k); mask
    broadcastable to (B, H, T, T_keys), True where a query may look; blocks default to half.

    Returns the output (B, H, T, d_k) and each row's logsumexp L (B, H, T), kept for the backward.
    """
    B, H, T, d_k = Q.shape
    T_keys = K.size(2)
    block_q, block_k = block_q or -(-T // 2), block_k or -(-T_keys // 2)  # default: 2 × 2 tiles
    if mask is not None:
        mask = mask.expand(B, H, T, T_keys)  # a view: every tile slices the same mask
    outputs, logsumexps = [], []
    for i in range(0, T, block_q):
        Q_i = Q[:, :, i:i + block_q]  # (B, H, B_r, d_k): one query tile, kept on chip
        m = torch.full(Q_i.shape[:-1], float("-inf"), dtype=Q.dtype, device=Q.device)  # (B, H, B_r)
        l = torch.zeros(Q_i.shape[:-1], dtype=Q.dtype, device=Q.device)  # (B, H, B_r) running sum
        O_i = torch.zeros_like(Q_i)  # (B, H, B_r, d_k) output, not yet divided by l
        for j in range(0, T_keys, block_k):
            K_j, V_j = K[:, :, j:j + block_k], V[:, :, j:j + block_k]  # (B, H, B_c, d_k)
            S_ij = torch.matmul(Q_i, K_j.transpose(-2, -1)) / math.sqrt(d_k)  # (B, H, B_r, B_c)
            if mask is not None:
                S_ij = S_ij.masked_fill(~mask[:, :, i:i + block_q, j:j + block_k], float("-inf"))
            m_new = torch.maximum(m, S_ij.amax(dim=-1))  # (B, H, B_r) the row max so far
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # a row with no key yet
            P_ij = torch.exp(S_ij - m_safe[..., None])  # (B, H, B_r, B_c) this tile's weights, unnormalised
            rescale = torch.exp(m - m_safe)  # (B, H, B_r) exp(m_old - m_new): older terms shrink
            l = rescale * l + P_ij.sum(dim=-1)  # (B, H, B_r)
            O_i = rescale[..., None] * O_i + torch.matmul(P_ij, V_j)  # (B, H, B_r, d_k)
            m = m_new
        # divide once at the end; a row with every key masked has l = 0 and stays 0, as explicit
        outputs.append(O_i / l.masked_fill(l == 0, 1.0)[..., None])  # (B, H, B_r, d_k)
        logsumexps.append(m + torch.log(l))  # (B, H, B_r) L = m + log ℓ
    return torch.cat(outputs, dim=2), torch.cat(logsumexps, dim=2)  # (B, H, T, d_k), (B, H, T)


class StaticKVCache(KVCache):
    """A cross-attention's keys and values: filled once (from the encoder's output), then read at
    every step unchanged; a later step hands no new keys (an empty sequence) and nothing is copied."""

    def append(self, k, v):
        if self.k is None:
            self.k, self.v = k, v
        return self.k, self.v
