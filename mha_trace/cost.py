"""What attention costs, from first principles. Plain arithmetic: this module never imports torch.

Symbols: B batch, T sequence length, D d_model, H query heads, G key/value heads (G = H for
multi-head, 1 for multi-query), d_k = D / H, L layers, s bytes per element.
"""

from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Dims:
    batch: int
    seq: int
    d_model: int
    heads: int
    kv_heads: int
    dtype: str = "float32"
    bias: bool = True
    mask: bool = False  # a boolean (T, T) mask is passed to forward

    @property
    def d_k(self) -> int:
        return self.d_model // self.heads

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.d_k

    @property
    def itemsize(self) -> int:
        return DTYPE_BYTES[self.dtype]


def parameters(d: Dims) -> dict:
    """Parameter count of each projection: weights D×D for Q and O, D×(G·d_k) for K and V."""
    b = 1 if d.bias else 0
    return {
        "W_q": d.d_model * d.d_model + b * d.d_model,
        "W_k": d.d_model * d.kv_dim + b * d.kv_dim,
        "W_v": d.d_model * d.kv_dim + b * d.kv_dim,
        "W_o": d.d_model * d.d_model + b * d.d_model,
    }


def forward_bytes(d: Dims) -> dict:
    """Bytes newly allocated by one eager forward pass of attention.MultiHeadAttention.

    Nothing is assumed freed, so the total is an upper bound on the peak. Views allocate nothing.
    """
    B, T, D, H, s = d.batch, d.seq, d.d_model, d.heads, d.itemsize
    btd, bht2 = B * T * D * s, B * H * T * T * s
    parts = {
        "input": btd,
        "projections": btd + 2 * B * T * d.kv_dim * s,  # W_q(q), W_k(k), W_v(v)
        "kv repeat": 2 * btd if d.kv_heads != d.heads else 0,  # K, V expanded to H heads
        "scores": bht2 * (3 + (2 if d.mask else 0)),  # QK^T, / sqrt(d_k), [masked_fill], softmax, [zero]
        "mask": 3 * T * T if d.mask else 0,  # the bool mask and its two negations (1 byte each)
        "context": 3 * btd,  # weights @ V, contiguous copy, W_o
    }
    return parts


def peak_bytes(d: Dims) -> int:
    """Parameters plus everything the forward pass allocates."""
    return sum(parameters(d).values()) * d.itemsize + sum(forward_bytes(d).values())


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable
