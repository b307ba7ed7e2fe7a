"""FlashAttention-2 as CS336's assignment 2 asks for it, forward and backward (verify --impl tiled)."""

import math

import torch


class FlashAttention(torch.autograd.Function):
    """Query tiles of B_Q rows meet key tiles of B_K keys one by one, keeping a running max m, a
    running sum l and an output not yet divided by l; the logsumexp L is saved for the backward."""

    B_Q, B_K = 16, 16

    @staticmethod
    def forward(ctx, Q, K, V, is_causal=False):
        B_Q, B_K = FlashAttention.B_Q, FlashAttention.B_K
        batch, n_q, d = Q.shape
        O = torch.empty_like(Q)
        L = torch.empty(batch, n_q, dtype=Q.dtype, device=Q.device)
        for i in range(0, n_q, B_Q):
            Q_i = Q[:, i:i + B_Q]
            m = torch.full(Q_i.shape[:-1], float("-inf"), dtype=Q.dtype, device=Q.device)
            l = torch.zeros(Q_i.shape[:-1], dtype=Q.dtype, device=Q.device)
            O_i = torch.zeros_like(Q_i)
            for j in range(0, K.shape[1], B_K):
                if is_causal and j > i + Q_i.shape[1] - 1:
                    break  # every key of this tile and the next comes after every query of Q_i
                K_j, V_j = K[:, j:j + B_K], V[:, j:j + B_K]
                S = Q_i @ K_j.transpose(-2, -1) / math.sqrt(d)
                if is_causal:
                    later = torch.arange(j, j + K_j.shape[1])[None, :] > torch.arange(i, i + Q_i.shape[1])[:, None]
                    S = S.masked_fill(later, float("-inf"))
                m_new = torch.maximum(m, S.amax(dim=-1))
                P = torch.exp(S - m_new[..., None])
                alpha = torch.exp(m - m_new)
                l = alpha * l + P.sum(dim=-1)
                O_i = alpha[..., None] * O_i + P @ V_j
                m = m_new
            O[:, i:i + B_Q] = O_i / l[..., None]
            L[:, i:i + B_Q] = m + torch.log(l)
        ctx.save_for_backward(L, Q, K, V, O)
        ctx.is_causal = is_causal
        return O

    @staticmethod
    def backward(ctx, dO):
        """Recomputed from L, whole (CS336's first backward): P = exp(S - L), D = rowsum(dO ∘ O)."""
        L, Q, K, V, O = ctx.saved_tensors
        scale = 1 / math.sqrt(Q.shape[-1])
        S = Q @ K.transpose(-2, -1) * scale
        if ctx.is_causal:
            S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
        P = torch.exp(S - L[..., None])
        dV = P.transpose(-2, -1) @ dO
        dP = dO @ V.transpose(-2, -1)
        dS = P * (dP - (dO * O).sum(dim=-1, keepdim=True))
        return dS @ K * scale, dS.transpose(-2, -1) @ Q * scale, dV, None
