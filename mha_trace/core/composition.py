"""How much a later head reads what an earlier head writes (Elhage et al. 2021, "A Mathematical
Framework for Transformer Circuits"), from the weights alone.

In the row-vector convention (q = x W_Q), head h reads with W_QK = W_Q W_Kᵀ and writes
W_OV = W_V W_O (each d_model × d_model, of rank d_k). Head b composes with an earlier head a by

    Q-composition  ‖W_OV(a) W_QK(b)‖ / (‖W_OV(a)‖ ‖W_QK(b)‖)    (a's output in b's queries)
    K-composition  ‖W_OV(a) W_QK(b)ᵀ‖ / (...)                    (... in b's keys)
    V-composition  ‖W_OV(a) W_OV(b)‖ / (...)                     (... in b's values)

with Frobenius norms. A product with a rank-d_k matrix L Rᵀ keeps its norm when L and R give
way to d_k × d_k square roots of their Gram matrices (R with RᵀR = LᵀL), so every score is the
norm of a d_k × d_k block of one product (`pair_scores`). Under grouped-query attention a head reads
its K/V head's W_K and W_V; the norm a layer reads through (RMSNorm's weight) is folded into its
W_Q, W_K and W_V. RoPE turns q and k by position, not by content, and is left out, as the framework leaves it out.
"""

import numpy as np

KINDS = ("Q", "K", "V")


def factors(attention, norm_weight=None) -> dict:
    """Each head's W_Q, W_K, W_V (heads, D, d_k: its K/V head's under GQA) and W_O (heads, d_k,
    D), in the row-vector convention, with the read norm's weight folded in."""
    H, G, d = attention.heads, attention.kv_heads, attention.d_k
    weight = lambda W: W.weight.detach().double().cpu().numpy()
    kv = np.arange(H) // (H // G)
    scale = 1.0 if norm_weight is None else norm_weight.detach().double().cpu().numpy()[:, None]
    split = lambda W, heads: (weight(W).reshape(heads, d, -1).transpose(0, 2, 1)) * scale
    return {"Q": split(attention.W_q, H), "K": split(attention.W_k, G)[kv],
            "V": split(attention.W_v, G)[kv],
            "O": weight(attention.W_o).reshape(-1, H, d).transpose(1, 2, 0)}


def _root(M: np.ndarray) -> np.ndarray:
    """(n, D, d_k) -> (n, d_k, d_k) R with RᵀR = MᵀM, so ‖M X‖ = ‖R X‖ for every X (QR's R
    would do; the Gram matrix's square root is one small eigh a head, and much quicker)."""
    values, vectors = np.linalg.eigh(M.transpose(0, 2, 1) @ M)
    return np.sqrt(np.clip(values, 0, None))[..., None] * vectors.transpose(0, 2, 1)


def writers(f: dict) -> np.ndarray:
    """(heads, d_k, D): each head's W_OV = W_V W_O as root(W_V) W_O: the same norms in products."""
    return _root(f["V"]) @ f["O"]


def readers(f: dict) -> dict:
    """kind -> (heads, D, d_k): the side of each reading matrix that meets a writer (W_Q for
    Q-composition, W_K for K, W_V for V), times its other side's root."""
    pairs = {"Q": (f["Q"], f["K"]), "K": (f["K"], f["Q"]), "V": (f["V"], f["O"].transpose(0, 2, 1))}
    return {kind: near @ _root(far).transpose(0, 2, 1) for kind, (near, far) in pairs.items()}


def pair_scores(written: np.ndarray, read: np.ndarray) -> np.ndarray:
    """(writers, readers): ‖W_OV(a) M(b)‖ / (‖W_OV(a)‖ ‖M(b)‖) for every pair."""
    (a, d, D), b = written.shape, len(read)
    # one BLAS product, in float32 (the scores to about 1e-6: far below any difference read off them)
    block = (np.asarray(written.reshape(a * d, D), np.float32)
             @ np.asarray(read.transpose(1, 0, 2).reshape(D, b * d), np.float32))
    top = np.sqrt((block.reshape(a, d, b, d).astype(np.float64) ** 2).sum((1, 3)))
    return top / np.outer(np.linalg.norm(written, axis=(1, 2)), np.linalg.norm(read, axis=(1, 2)))


def random_baseline(d_model: int, d_k: int, draws: int = 200, seed: int = 0) -> np.ndarray:
    """(draws,) the scores of random Gaussian matrices of the same shapes and ranks."""
    g = np.random.default_rng(seed)
    f = {k: g.standard_normal((draws, d_model, d_k)) for k in ("Q", "K", "V")}
    f["O"] = g.standard_normal((draws, d_k, d_model))
    written, read = writers(f), readers(f)["Q"][::-1]  # each draw against an unrelated one
    block = np.einsum("aid,adj->aij", written, read)
    return np.sqrt((block ** 2).sum((1, 2))) / (np.linalg.norm(written, axis=(1, 2)) *
                                                np.linalg.norm(read, axis=(1, 2)))
