"""`verify`: the module against independent references, on the same input and weights.

References: numpy written out by hand (float64), torch.nn.MultiheadAttention (per-head weights via
average_attn_weights=False) and F.scaled_dot_product_attention (attn_mask, enable_gqa).
"""

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from mha_trace.errors import MhaError
from mha_trace.records import Shows
from mha_trace.runs.run import Run, check_finite
from mha_trace.core.runtime import one_thread

# max |difference| allowed, relative to the largest |reference value| (at least 1)
TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "float16": 1e-2, "bfloat16": 5e-2}


@dataclass
class Check:
    reference: str
    compares: str  # "output" | "per-head weights"
    max_abs: float | None  # None: the reference cannot give this quantity
    tolerance: float
    note: str = ""

    @property
    def passed(self) -> bool | None:
        return None if self.max_abs is None else bool(self.max_abs <= self.tolerance)


@dataclass
class VerifyReport(Shows):
    description: str
    dtype: str
    device: str
    checks: list[Check]
    settings: dict = None  # what ran, as JSON keys: the config, sizes, heads, mask, ...

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks)


def numpy_rope(x: np.ndarray, base: float, dims: int | None = None) -> np.ndarray:
    """RoPE by hand: pair (x_i, x_{i+d/2}) at position p turns by the angle p · base^(-2i/d); with
    `dims`, d is the first `dims` of the last axis and the rest pass through (partial RoPE)."""
    if dims is not None and dims < x.shape[-1]:
        return np.concatenate([numpy_rope(x[..., :dims], base), x[..., dims:]], axis=-1)
    T, d = x.shape[-2], x.shape[-1]
    half = d // 2
    out = np.empty_like(x)
    for p in range(T):
        for i in range(half):
            a = p * base ** (-2 * i / d)
            x1, x2 = x[..., p, i], x[..., p, i + half]
            out[..., p, i] = x1 * np.cos(a) - x2 * np.sin(a)
            out[..., p, i + half] = x2 * np.cos(a) + x1 * np.sin(a)
    return out


def numpy_relative_bias(table: np.ndarray, T: int, T_keys: int) -> np.ndarray:
    """T5's bias by hand (H, T, T_keys) from its (32, H) table: the offset j - i's bucket, bidirectional
    (16 a side: offsets below 8 one each, then log-spaced up to 128, the rest in the last)."""
    out = np.empty((table.shape[1], T, T_keys))
    for i in range(T):
        for j in range(T_keys):
            n = abs(j - i)
            far = 8 + int(math.log(max(n, 1) / 8) / math.log(128 / 8) * 8)
            out[:, i, j] = table[16 * (j > i) + (n if n < 8 else min(far, 15))]
    return out


def numpy_qk_norm(module, Q: np.ndarray, K: np.ndarray) -> tuple:
    """QK-norm by hand: each head's q and k over their RMS (eps 1e-6), times the module's gains."""
    if not module.qk_norm:
        return Q, K
    gain = lambda norm: norm.weight.detach().double().cpu().numpy()
    rms = lambda t: np.sqrt((t ** 2).mean(-1, keepdims=True) + 1e-6)
    return Q / rms(Q) * gain(module.q_norm), K / rms(K) * gain(module.k_norm)


def reference_mask(module, mask, T: int) -> np.ndarray | None:
    """The mask the references use: the run's, and the module's sliding window built by hand."""
    keep = None if mask is None else mask.detach().cpu().numpy().astype(bool)
    if module.window is not None:
        band = np.tril(np.ones((T, T), bool)) & np.triu(np.ones((T, T), bool), -(module.window - 1))
        keep = band if keep is None else keep & band
    return keep


def _halves(t: np.ndarray, base: float | None) -> tuple:
    """Each head's dims (B, n, T, d_k) as its two halves, each turned by RoPE as a head of its own."""
    half = t.shape[-1] // 2
    parts = (t[..., :half], t[..., half:])
    return parts if base is None else tuple(numpy_rope(p, base) for p in parts)


def numpy_differential(module, q, k, v, mask):
    """Differential attention by hand in float64: softmax(Q1 K1ᵀ/√d) - λ softmax(Q2 K2ᵀ/√d), d = d_k/2,
    λ from its four vectors, each head's Σ w·v RMS-normed (eps 1e-5) and times 1 - λ_init."""
    to = lambda t: t.detach().double().cpu().numpy()
    lin = lambda layer, x: to(x) @ to(layer.weight).T + (to(layer.bias) if layer.bias is not None else 0)
    B, T, _ = q.shape
    H, G, d_k = module.heads, module.kv_heads, module.d_k
    heads = lambda t, n: t.reshape(B, -1, n, d_k).transpose(0, 2, 1, 3)
    Q, K = numpy_qk_norm(module, heads(lin(module.W_q, q), H), heads(lin(module.W_k, k), G))
    V = heads(lin(module.W_v, v), G).repeat(H // G, axis=1)
    base = module.rope_base if module.rope else None
    keep = reference_mask(module, mask, T)
    maps = []
    for q_half, k_half in zip(_halves(Q, base), _halves(K.repeat(H // G, axis=1), base)):
        s = q_half @ k_half.transpose(0, 1, 3, 2) / np.sqrt(d_k // 2)
        s = s if keep is None else np.where(keep, s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        maps.append(e / e.sum(-1, keepdims=True))
    dot = lambda a, b: float(to(a) @ to(b))
    lam = np.exp(dot(module.lambda_q1, module.lambda_k1)) - np.exp(dot(module.lambda_q2, module.lambda_k2)) \
        + module.lambda_init
    weights = maps[0] - lam * maps[1]
    mixed = weights @ V
    normed = (1 - module.lambda_init) * mixed / np.sqrt((mixed ** 2).mean(-1, keepdims=True) + 1e-5)
    return lin(module.W_o, torch.from_numpy(normed.transpose(0, 2, 1, 3).reshape(B, T, H * d_k))), weights


def numpy_reference(module, q, k, v, mask):
    """Attention by hand in float64 from the module's weights: (output, weights)."""
    if module.diff:
        return numpy_differential(module, q, k, v, mask)
    to = lambda t: t.detach().double().cpu().numpy()
    lin = lambda layer, x: to(x) @ to(layer.weight).T + (to(layer.bias) if layer.bias is not None else 0)
    B, T, _ = q.shape
    H, G, d_k = module.heads, module.kv_heads, module.d_k
    Q = lin(module.W_q, q).reshape(B, T, H, d_k).transpose(0, 2, 1, 3)
    K = lin(module.W_k, k).reshape(B, -1, G, d_k).transpose(0, 2, 1, 3)
    Q, K = numpy_qk_norm(module, Q, K)
    if module.rope:
        Q, K = (numpy_rope(t, module.rope_base, module.rope_dims) for t in (Q, K))
    K = K.repeat(H // G, axis=1)
    V = lin(module.W_v, v).reshape(B, -1, G, d_k).transpose(0, 2, 1, 3).repeat(H // G, axis=1)
    scores = Q @ K.transpose(0, 1, 3, 2) / np.sqrt(d_k)
    if module.alibi:  # -m_h·|i - j|, the slopes 2^(-8h/H) (H a power of 2) written out here
        n = 2 ** int(np.floor(np.log2(H)))
        slopes = [2 ** (-8 * h / n) for h in range(1, n + 1)] + [2 ** (-4 * (2 * h + 1) / n) for h in range(H - n)]
        distance = np.abs(np.arange(T)[:, None] - np.arange(K.shape[2])[None, :])
        scores = scores - np.array(slopes)[:, None, None] * distance
    if module.relative_bias:
        scores = scores + numpy_relative_bias(module.rel_bias.weight.detach().double().cpu().numpy(), T, K.shape[2])
    if module.softcap is not None:
        scores = module.softcap * np.tanh(scores / module.softcap)
    keep = reference_mask(module, mask, T)
    sink = None if module.sinks is None else to(module.sink)[None, :, None, None]  # (1, H, 1, 1)
    if keep is not None:  # a query that sees no key at all gets no weight anywhere (context 0)
        seen = keep.any(-1, keepdims=True) | (sink is not None)
        scores = np.where(keep, scores, np.where(seen, -np.inf, 0.0))
    top = scores.max(-1, keepdims=True) if sink is None else np.maximum(scores.max(-1, keepdims=True), sink)
    e = np.exp(scores - top)
    weights = e / (e.sum(-1, keepdims=True) + (0 if sink is None else np.exp(sink - top)))
    if keep is not None:
        weights = np.where(keep, weights, 0.0)
    context = (weights @ V).transpose(0, 2, 1, 3).reshape(B, T, H * d_k)
    return lin(module.W_o, torch.from_numpy(context)), weights


def torch_mha_reference(module, q, k, v, mask):
    ref = torch.nn.MultiheadAttention(module.d_model, module.heads, bias=module.W_q.bias is not None,
                                      batch_first=True, device=q.device, dtype=q.dtype)
    keep = reference_mask(module, mask, q.size(1))
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([module.W_q.weight, module.W_k.weight, module.W_v.weight]))
        if ref.in_proj_bias is not None:
            ref.in_proj_bias.copy_(torch.cat([module.W_q.bias, module.W_k.bias, module.W_v.bias]))
            ref.out_proj.bias.copy_(module.W_o.bias)
        ref.out_proj.weight.copy_(module.W_o.weight)
        # nn.MultiheadAttention's boolean mask is True where attention is *not* allowed
        blocked = None if keep is None else torch.from_numpy(~keep).to(q.device)
        return ref(q, k, v, attn_mask=blocked, average_attn_weights=False)


def sdpa_differential(module, q, k, v, mask):
    """Differential attention as two F.scaled_dot_product_attention calls, one a half of q and k
    (DiffLlama's way): out₁ - λ out₂, then each head RMS-normed (nn.RMSNorm) and times 1 - λ_init."""
    B, T, _ = q.shape
    H, G, d_k = module.heads, module.kv_heads, module.d_k
    keep = reference_mask(module, mask, T)
    base = module.rope_base if module.rope else None
    with torch.no_grad():
        Q = F.linear(q, module.W_q.weight, module.W_q.bias).view(B, T, H, d_k).transpose(1, 2)
        K = F.linear(k, module.W_k.weight, module.W_k.bias).view(B, -1, G, d_k).transpose(1, 2)
        V = F.linear(v, module.W_v.weight, module.W_v.bias).view(B, -1, G, d_k).transpose(1, 2)
        back = lambda t: torch.from_numpy(t).to(device=q.device, dtype=q.dtype)
        Q, K = numpy_qk_norm(module, *(t.double().cpu().numpy() for t in (Q, K)))
        halves = zip(*(map(back, _halves(t, base)) for t in (Q, K)))
        attn_mask = None if keep is None else torch.from_numpy(keep).to(q.device)
        out_1, out_2 = (F.scaled_dot_product_attention(qh, kh, V, attn_mask=attn_mask, enable_gqa=G != H)
                        for qh, kh in halves)
        mixed = out_1 - module.lam() * out_2
        normed = (1 - module.lambda_init) * torch.nn.RMSNorm(d_k, eps=1e-5, elementwise_affine=False)(mixed)
        return F.linear(normed.transpose(1, 2).reshape(B, T, H * d_k), module.W_o.weight, module.W_o.bias)


def sdpa_reference(module, q, k, v, mask):
    """F.scaled_dot_product_attention with an explicit mask (and RoPE turned by hand)."""
    if module.diff:
        return sdpa_differential(module, q, k, v, mask)
    B, T, _ = q.shape
    H, G, d_k = module.heads, module.kv_heads, module.d_k
    keep = reference_mask(module, mask, T)
    with torch.no_grad():
        Q = F.linear(q, module.W_q.weight, module.W_q.bias).view(B, T, H, d_k).transpose(1, 2)
        K = F.linear(k, module.W_k.weight, module.W_k.bias).view(B, -1, G, d_k).transpose(1, 2)
        V = F.linear(v, module.W_v.weight, module.W_v.bias).view(B, -1, G, d_k).transpose(1, 2)
        if module.qk_norm:
            normed = numpy_qk_norm(module, *(t.double().cpu().numpy() for t in (Q, K)))
            Q, K = (torch.from_numpy(t).to(device=q.device, dtype=q.dtype) for t in normed)
        if module.rope:
            turn = lambda t: torch.from_numpy(numpy_rope(t.double().cpu().numpy(), module.rope_base, module.rope_dims))
            Q, K = (turn(t).to(device=q.device, dtype=q.dtype) for t in (Q, K))
        attn_mask = None if keep is None else torch.from_numpy(keep).to(q.device)
        out = F.scaled_dot_product_attention(Q, K, V, attn_mask=attn_mask, enable_gqa=G != H)
        return F.linear(out.transpose(1, 2).reshape(B, T, H * d_k), module.W_o.weight, module.W_o.bias)


def _max_abs(a, b) -> float:
    a = a.detach().double().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a, float)
    b = b.detach().double().cpu().numpy() if isinstance(b, torch.Tensor) else np.asarray(b, float)
    return float(np.abs(a - b).max())


def run_checks(module, q, k, v, mask, dtype: str) -> list[Check]:
    with torch.no_grad():
        out, weights = module(q, k, v, mask=mask)
    check_finite(out, weights)
    scale = lambda ref: TOLERANCE[dtype] * max(1.0, float(np.abs(np.asarray(ref, float)).max()))
    impl = getattr(module, "impl", "sdpa")
    fused = (f"the module runs the {'tiled' if impl == 'tiled' else 'fused'} path (--impl {impl}), "
             f"which returns no weights")

    def weights_check(reference: str, ref_w, rows=slice(None), note: str = "") -> Check:
        if weights is None:
            return Check(reference, "per-head weights", None, TOLERANCE[dtype], fused)
        return Check(reference, "per-head weights",
                     _max_abs(weights[..., rows, :], ref_w[..., rows, :]), TOLERANCE[dtype], note)

    np_out, np_w = numpy_reference(module, q, k, v, mask)
    checks = [Check("numpy by hand, float64", "output", _max_abs(out, np_out), scale(np_out)),
              weights_check("numpy by hand, float64", np_w)]
    missing = [name for name, on in (("RoPE", module.rope), ("QK-norm", module.qk_norm), ("ALiBi", module.alibi),
                                     ("relative bias", module.relative_bias),
                                     ("differential", module.diff),
                                     ("soft-capping", module.softcap is not None),
                                     ("sink", module.sinks is not None)) if on]
    if missing:
        checks.append(Check("nn.MultiheadAttention", "output", None, scale(np_out),
                            f"no {' or '.join(missing)} option in it"))
    elif module.kv_heads == module.heads:
        diff, ref_w, rows, note = _torch_mha_compared(module, q, k, v, mask, out)
        checks += [Check("nn.MultiheadAttention", "output", diff, scale(np_out), note),
                   weights_check("nn.MultiheadAttention", ref_w, rows, note)]
    else:
        checks.append(Check("nn.MultiheadAttention", "output", None, scale(np_out),
                            "no grouped-query option in it"))
    said = ["enable_gqa=True" if module.kv_heads != module.heads else "",
            "explicit window mask" if module.window is not None else "",
            "RoPE turned in numpy" if module.rope else "", "QK-norm in numpy" if module.qk_norm else "",
            "two calls, one a map" if module.diff else ""]
    plain = module.softcap is None and module.sinks is None and not module.alibi \
        and not module.relative_bias  # SDPA: no hook on the scores
    checks += [Check("F.scaled_dot_product_attention", "output",
                     _max_abs(out, sdpa_reference(module, q, k, v, mask)) if plain else None, scale(np_out),
                     ", ".join(n for n in said if n) if plain else
                     "no hook on the scores for a position bias, soft-capping or a sink (FlexAttention's score_mod "
                     "has one)"),
               Check("F.scaled_dot_product_attention", "per-head weights", None, TOLERANCE[dtype],
                     "returns only the output: fused kernels never form the weights")]
    return checks


def _torch_mha_compared(module, q, k, v, mask, out) -> tuple:
    """nn.MultiheadAttention against the module on the queries that see at least one key (it
    gives NaN for a query whose every key is masked, where the lecture's module gives 0):
    (largest output difference, its weights, the rows compared, a note)."""
    ref_out, ref_w = torch_mha_reference(module, q, k, v, mask)
    keep = reference_mask(module, mask, q.size(1))
    if keep is None or keep.any(-1).all():
        return _max_abs(out, ref_out), ref_w, slice(None), ""
    rows = torch.from_numpy(keep.any(-1))
    note = f"{int((~rows).sum())} queries see no key: compared on the others (it gives NaN there)"
    return _max_abs(out[:, rows], ref_out[:, rows]), ref_w, rows, note


def _numbers_on(device: str) -> None:
    if device == "meta":
        raise MhaError("verify compares numbers, and the meta device holds none (use cpu or cuda)",
                       quantity="device")


def check_references(run: Run, checks_of=None) -> VerifyReport:
    """Run every reference on the run's module, inputs and mask; `checks_of` (module, q, k, v,
    mask, dtype) -> [Check]: the references of another lecture module (MLA's), else run_checks."""
    _numbers_on(run.sizes.device)
    s, c = run.sizes, run.config
    if c is not None:
        desc = (f"config {c.name}: {len(c.tokens)} tokens, d_model={c.d_model} heads={c.heads}"
                f"{f' kv_heads={c.kv_heads}' if c.kv_heads else ''} mask={c.mask}"
                f"{f' pad={c.pad}' if c.pad else ''}")
    else:
        kv = "" if s.latent else f"kv_heads={s.kv_heads or s.heads} "
        desc = (f"batch={s.batch} seq={s.seq} d_model={s.d_model} heads={s.heads} "
                f"{kv}mask={s.mask}{f' pad={s.pad}' if s.pad else ''} seed={s.seed}")
    modern = "".join([s.rope_setting(), f" window={s.window}" if s.window else "",
                      f" impl={s.impl}" if s.impl != "explicit" else "",
                      s.scoring.settings(),
                      f" latent={s.latent} rope_dim={run.module.rope_dim}{' absorbed' * s.absorbed}" if s.latent else ""])
    desc += modern
    q, k, v = run.qkv
    with one_thread():
        checks = (checks_of or run_checks)(run.module, q, k, v, run.mask, s.dtype)
    settings = {"config": c.name if c is not None else None, "batch": 1 if c is not None else s.batch,
                "seq": len(c.tokens) if c is not None else s.seq,
                "d_model": c.d_model if c is not None else s.d_model,
                "heads": c.heads if c is not None else s.heads,
                "kv_heads": (c.kv_heads if c is not None else s.kv_heads) or
                            (c.heads if c is not None else s.heads),
                "mask": c.mask if c is not None else s.mask, "pad": c.pad if c is not None else s.pad,
                "seed": (None if c.explicit else c.seed) if c is not None else s.seed, "rope": s.rope,
                "window": s.window, "impl": s.impl, **s.scoring.module_options(), "latent": s.latent,
                "absorbed": s.absorbed, **({"rope_dim": s.rope_dim} if s.rope and s.rope_dim else {})}
    return VerifyReport(desc, s.dtype, s.device, checks, settings)


