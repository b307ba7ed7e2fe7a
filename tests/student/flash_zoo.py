"""FlashAttention-2's forward as CS336's assignment 2 asks for it: a torch.autograd.Function whose
forward(ctx, Q, K, V, is_causal) walks query tiles of B_Q rows against key tiles of B_K, saves the
logsumexp L for the backward and returns O. Each subclass is one classic mistake (its `bug`), at
its own line below; `FlashAttention` is right, at the tile sizes of each Right subclass."""

import math

import torch


def flash_forward(Q, K, V, is_causal=False, bug="", B_Q=16, B_K=16):
    batch, n_q, d = Q.shape
    n_k = K.shape[-2]
    scale = 1.0 if bug == "no_scale" else 1 / math.sqrt(d)
    O = torch.empty_like(Q)
    L = torch.empty(batch, n_q, dtype=Q.dtype, device=Q.device)
    for i in range(0, n_q, B_Q):
        Q_i = Q[:, i:i + B_Q]
        rows = Q_i.shape[1]
        m = torch.full((batch, rows), float("-inf"), dtype=Q.dtype, device=Q.device)
        l = torch.zeros((batch, rows), dtype=Q.dtype, device=Q.device)
        O_i = torch.zeros_like(Q_i)
        for j in range(0, n_k, B_K):
            if is_causal and (j >= i if bug == "skip_diagonal" else j > i + rows - 1):
                continue
            K_j, V_j = K[:, j:j + B_K], V[:, j:j + B_K]
            S = Q_i @ K_j.transpose(-2, -1) * scale
            if is_causal and bug != "no_tile_mask":
                later = torch.arange(j, j + K_j.shape[1])[None, :] > torch.arange(i, i + rows)[:, None]
                S = S.masked_fill(~later if bug == "mask_flipped" else later, float("-inf"))
            m_new = torch.maximum(m, S.amax(dim=-1))
            P = torch.exp(S - m_new[..., None])
            alpha = torch.exp(m_new - m) if bug == "rescale_flipped" else torch.exp(m - m_new)
            l = l + P.sum(dim=-1) if bug == "l_not_rescaled" else alpha * l + P.sum(dim=-2 if bug == "sum_axis" else -1)
            PV = P @ (K_j if bug == "times_k" else V_j)
            O_i = O_i + PV if bug == "o_not_rescaled" else alpha[..., None] * O_i + (PV / l[..., None] if bug == "divide_each" else PV)
            m = m_new
        O[:, i:i + B_Q] = O_i if bug in ("no_division", "divide_each") else O_i / l[..., None]
        L[:, i:i + B_Q] = torch.log(l) if bug == "lse_no_m" else m + l if bug == "lse_no_log" else m + torch.log(l)
    return O, L


class FlashAttention(torch.autograd.Function):
    bug, B_Q, B_K = "", 16, 16

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        me = ctx._forward_cls  # the subclass apply was called on
        O, L = flash_forward(Q, K, V, is_causal, me.bug, me.B_Q, me.B_K)
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = is_causal
        return O

    @staticmethod
    def backward(ctx, dO):
        raise NotImplementedError


class Tiles8x32(FlashAttention): B_Q, B_K = 8, 32
class Tiles32x8(FlashAttention): B_Q, B_K = 32, 8
class NoScale(FlashAttention): bug = "no_scale"
class SkipDiagonal(FlashAttention): bug = "skip_diagonal"
class NoTileMask(FlashAttention): bug = "no_tile_mask"
class MaskFlipped(FlashAttention): bug = "mask_flipped"
class RescaleFlipped(FlashAttention): bug = "rescale_flipped"
class LNotRescaled(FlashAttention): bug = "l_not_rescaled"
class SumAxis(FlashAttention): bug = "sum_axis"
class TimesK(FlashAttention): bug = "times_k"
class ONotRescaled(FlashAttention): bug = "o_not_rescaled"
class DivideEach(FlashAttention): bug = "divide_each"
class NoDivision(FlashAttention): bug = "no_division"
class LseNoM(FlashAttention): bug = "lse_no_m"
class LseNoLog(FlashAttention): bug = "lse_no_log"


def recomputed_backward(ctx, dO, bug=""):
    """CS336's first backward: recomputed from L, whole; D = rowsum(dO ∘ O)."""
    L, Q, K, V, O = ctx.saved_tensors
    scale = 1 / math.sqrt(Q.shape[-1])
    S = Q @ K.transpose(-2, -1) * scale
    if ctx.is_causal:
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    P = torch.exp(S - L[..., None])
    dP = dO @ V.transpose(-2, -1)
    dS = P * dP if bug == "no_d" else P * (dP - (dO * O).sum(dim=-1, keepdim=True))
    return dS @ K * scale, dS.transpose(-2, -1) @ Q * scale, P.transpose(-2, -1) @ dO, None


class WithBackward(FlashAttention):
    @staticmethod
    def backward(ctx, dO):
        return recomputed_backward(ctx, dO)


class BackwardWithoutD(FlashAttention):
    @staticmethod
    def backward(ctx, dO):
        return recomputed_backward(ctx, dO, "no_d")
