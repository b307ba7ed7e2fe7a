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
    """Each head's W_Q (heads, D, d_k) and W_O (heads, d_k, D), each K/V head's W_K and W_V
    (kv_heads, D, d_k), and "kv": the K/V head each query head reads; in the row-vector
    convention, with the read norm's weight folded into W_Q, W_K and W_V."""
    H, G, d = attention.heads, attention.kv_heads, attention.d_k
    weight = lambda W: W.weight.detach().double().cpu().numpy()
    scale = 1.0 if norm_weight is None else norm_weight.detach().double().cpu().numpy()[:, None]
    split = lambda W, heads: (weight(W).reshape(heads, d, -1).transpose(0, 2, 1)) * scale
    return {"Q": split(attention.W_q, H), "K": split(attention.W_k, G), "V": split(attention.W_v, G),
            "O": weight(attention.W_o).reshape(-1, H, d).transpose(1, 2, 0),
            "kv": np.arange(H) // (H // G)}


def _root(M: np.ndarray) -> np.ndarray:
    """(n, D, d_k) -> (n, d_k, d_k) R with RᵀR = MᵀM, so ‖M X‖ = ‖R X‖ for every X (QR's R
    would do; the Gram matrix's square root is one small eigh a head, and much quicker)."""
    values, vectors = np.linalg.eigh(M.transpose(0, 2, 1) @ M)
    return np.sqrt(np.clip(values, 0, None))[..., None] * vectors.transpose(0, 2, 1)


def writers(f: dict) -> np.ndarray:
    """(heads, d_k, D): each head's W_OV = W_V W_O as root(W_V) W_O: the same norms in products."""
    return _root(f["V"][f["kv"]]) @ f["O"]


def readers(f: dict) -> dict:
    """kind -> (near, index, root): head h reads with near[index[h]] root[h]ᵀ, the side that
    meets a writer (W_Q for Q-composition, its K/V head's W_K for K and W_V for V) and the root
    of its other side; under GQA the K/V heads' sides are kept once."""
    H, kv = len(f["Q"]), f["kv"]
    return {"Q": (f["Q"], np.arange(H), _root(f["K"][kv])),
            "K": (f["K"], kv, _root(f["Q"])),
            "V": (f["V"], kv, _root(f["O"].transpose(0, 2, 1)))}


def one_reader(reader: tuple, h: int) -> tuple:
    """The reader triple of head h (from 0) alone."""
    near, index, root = reader
    return near, index[h:h + 1], root[h:h + 1]


def pair_scores(written: np.ndarray, reader: tuple, written_norms=None) -> np.ndarray:
    """(writers, readers): ‖W_OV(a) M(b)‖ / (‖W_OV(a)‖ ‖M(b)‖) for every pair (`written_norms`:
    the writers' norms, when the caller keeps them)."""
    near, index, root = reader
    (a, d, D), (n, b) = written.shape, (len(near), len(index))
    # one BLAS product with each distinct near side, in float32 (the scores to about 1e-6: far
    # below any difference read off them), then each head's root
    P = (np.asarray(written.reshape(a * d, D), np.float32)
         @ np.asarray(near.transpose(1, 0, 2).reshape(D, n * d), np.float32))
    P = P.reshape(a * d, n, d).transpose(1, 0, 2)[index]  # (b, a·d, d)
    block = P @ np.asarray(root.transpose(0, 2, 1), np.float32)  # (b, a·d, d)
    top = np.sqrt(np.square(block, out=block).reshape(b, a, d * d).sum(-1, dtype=np.float64)).T
    if written_norms is None:
        written_norms = np.linalg.norm(written, axis=(1, 2))
    read_norms = np.linalg.norm(near[index] @ root.transpose(0, 2, 1), axis=(1, 2))
    return top / np.outer(written_norms, read_norms)


def random_baseline(d_model: int, d_k: int, draws: int = 100, seed: int = 0) -> np.ndarray:
    """(draws,) the scores of random Gaussian matrices of the same shapes and ranks, each draw's
    writer against another draw's reader."""
    g = np.random.default_rng(seed)
    f: dict[str, np.ndarray] = {k: g.standard_normal((draws, d_model, d_k)) for k in ("Q", "K", "V")}
    f["O"], f["kv"] = g.standard_normal((draws, d_k, d_model)), np.arange(draws)
    written = writers(f)
    near, index, root = readers(f)["Q"]
    read = near[index[::-1]] @ root[::-1].transpose(0, 2, 1)  # (draws, D, d_k), reversed
    block = written @ read
    return np.sqrt((block ** 2).sum((1, 2))) / (np.linalg.norm(written, axis=(1, 2)) *
                                                np.linalg.norm(read, axis=(1, 2)))
