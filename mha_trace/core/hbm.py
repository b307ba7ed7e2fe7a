"""Bytes that attention reads from and writes to main memory (a GPU's HBM), kernel by kernel.

Plain arithmetic, counted per (batch, head) and multiplied by B·H; N the sequence length, d = d_k,
s bytes per element. Standard attention runs one kernel per step and stores every N×N matrix it
makes (Dao et al. 2022, Algorithm 0 and Appendix B, with the mask and dropout as their own
kernels); the tiled pass is FlashAttention-2's loop (Dao 2023, Algorithms 1 and 2), whose N×N
tiles live in on-chip SRAM and never reach HBM. This module never imports torch.
"""

from dataclasses import dataclass

from mha_trace.errors import MhaError

SRAM_A100 = 192 * 1024  # bytes of on-chip SRAM per streaming multiprocessor (Dao et al. 2022, §2.1)
SRAM_MOST = 1 << 40  # 1 TiB: past any chip's on-chip memory (an H100 has 228 KB a multiprocessor)
STATS = 4  # a row's logsumexp L and the backward's D = rowsum(dO∘O) are fp32


@dataclass(frozen=True)
class Term:
    path: str  # "standard" | "tiled"
    pass_: str  # "forward" | "backward"
    step: str
    formula: str  # bytes, symbolic
    numbers: str  # the formula with the numbers put in
    bytes: int  # one layer, all batches and heads


@dataclass(frozen=True)
class Tiles:
    """Rows of the query tile (B_r) and of the key/value tile (B_c) in each pass."""

    forward: tuple[int, int]
    backward: tuple[int, int]
    rule: str  # how they were chosen


def tiles(d_k: int, itemsize: int, sram: int, block_q: int | None, block_k: int | None,
          seq: int) -> Tiles:
    """The given blocks for both passes, or Theorem 2's rule (Dao et al. 2022): the outer loop's
    tile ⌈M/4d⌉ rows, the inner loop's min(that, d), M = SRAM / s elements. The forward's outer
    loop runs over query tiles, the backward's over key tiles (FlashAttention-2)."""
    for name, value in (("sram", sram), ("block_q", block_q), ("block_k", block_k)):
        if value is not None and (type(value) is not int or value < 1):
            raise MhaError(f"{name}={value!r} must be a positive integer", quantity=name)
    if sram > SRAM_MOST:
        raise MhaError(f"sram is more on-chip memory than any chip has: at most {SRAM_MOST:,} "
                       f"bytes (an A100 has {SRAM_A100:,} a multiprocessor)", quantity="sram")
    if block_q or block_k:
        pair = (min(block_q or block_k, seq), min(block_k or block_q, seq))
        return Tiles(pair, pair, "as given, in both passes")
    outer = min(-(-sram // (itemsize * 4 * d_k)), seq)  # whole numbers: any --sram, no float
    inner = min(outer, d_k)
    if sram < 4 * d_k * itemsize * 2:
        raise MhaError(f"sram={sram} bytes holds less than a tile of 2 rows of d_k={d_k} "
                       f"(at least {8 * d_k * itemsize} bytes)", quantity="sram")
    return Tiles((outer, inner), (inner, outer),
                 f"Theorem 2's rule from {sram:,} bytes of SRAM: the outer loop's tile ⌈M/4d⌉ "
                 f"rows, the inner loop's min(⌈M/4d⌉, d)")


def traffic(B: int, H: int, N: int, d: int, s: int, t: Tiles, backward: bool,
            causal: bool, dropout: bool) -> list[Term]:
    """Every kernel's bytes, standard then tiled; the backward's too when `backward`."""
    heads = B * H
    terms = []

    def add(path, pass_, step, formula, numbers, per_head):
        terms.append(Term(path, pass_, step, f"B·H·({formula})", f"{B}·{H}·({numbers})",
                          heads * per_head))

    for pass_ in ("forward", "backward") if backward else ("forward",):
        for step, formula, numbers, per_head in _standard(N, d, s, pass_, causal, dropout):
            add("standard", pass_, step, formula, numbers, per_head)
        for step, formula, numbers, per_head in _tiled(N, d, s, pass_, t):
            add("tiled", pass_, step, formula, numbers, per_head)
    return terms


def _standard(N: int, d: int, s: int, pass_: str, causal: bool, dropout: bool) -> list:
    """(step, formula, numbers, bytes per head) of each kernel; an N×N read or write is N²·s, the
    dropout's keep-mask one byte a score."""
    nn, nd = f"{N}²·{s}", f"{N}·{d}·{s}"
    sq, rect = N * N * s, N * d * s
    if pass_ == "forward":
        steps = [("S = QKᵀ/√d_k: read Q, K, write S", "2·N·d·s + N²·s", f"2·{nd} + {nn}", 2 * rect + sq),
                 ("mask S (causal): read, write", "2·N²·s", f"2·{nn}", 2 * sq) if causal else None,
                 ("P = softmax(S): read, write", "2·N²·s", f"2·{nn}", 2 * sq),
                 ("dropout P: read, write P and its keep-mask", "2·N²·s + N²", f"2·{nn} + {N}²",
                  2 * sq + N * N) if dropout else None,
                 ("O = P·V: read P, V, write O", "N²·s + 2·N·d·s", f"{nn} + 2·{nd}", sq + 2 * rect)]
    else:
        steps = [("dV = Pᵀ·dO: read P, dO, write dV", "N²·s + 2·N·d·s", f"{nn} + 2·{nd}", sq + 2 * rect),
                 ("dP = dO·Vᵀ: read dO, V, write dP", "2·N·d·s + N²·s", f"2·{nd} + {nn}", 2 * rect + sq),
                 ("dropout backward: read dP and the keep-mask, write", "2·N²·s + N²",
                  f"2·{nn} + {N}²", 2 * sq + N * N) if dropout else None,
                 ("dS = P∘(dP − rowsum(dP∘P)): read P, dP, write dS", "3·N²·s", f"3·{nn}", 3 * sq),
                 ("mask backward (causal): read, write", "2·N²·s", f"2·{nn}", 2 * sq) if causal else None,
                 ("dQ = dS·K: read dS, K, write dQ", "N²·s + 2·N·d·s", f"{nn} + 2·{nd}", sq + 2 * rect),
                 ("dK = dSᵀ·Q: read dS, Q, write dK", "N²·s + 2·N·d·s", f"{nn} + 2·{nd}", sq + 2 * rect)]
    return [step for step in steps if step]


def _tiled(N: int, d: int, s: int, pass_: str, t: Tiles) -> list:
    """FlashAttention-2: the forward keeps a query tile in SRAM and streams every key/value tile
    past it (T_r = ⌈N/B_r⌉ times in all); the backward keeps a key/value tile and streams the
    queries, dO, L, D and dQ past it (T_c = ⌈N/B_c⌉ times). Masks and dropout happen in SRAM."""
    nd, rect = f"{N}·{d}·{s}", N * d * s
    if pass_ == "forward":
        Tr = -(-N // t.forward[0])
        return [("read Q, write O: once", "2·N·d·s", f"2·{nd}", 2 * rect),
                ("read K, V: once per query tile", "2·N·d·s·T_r", f"2·{nd}·{Tr}", 2 * rect * Tr),
                ("write the logsumexp L (fp32)", "4·N", f"4·{N}", STATS * N)]
    Tc = -(-N // t.backward[1])
    return [("D = rowsum(dO∘O): read dO, O, write D (fp32)", "2·N·d·s + 4·N", f"2·{nd} + 4·{N}",
             2 * rect + STATS * N),
            ("read K, V, write dK, dV: once", "4·N·d·s", f"4·{nd}", 4 * rect),
            ("read Q, dO, L, D: once per key tile", "(2·N·d·s + 8·N)·T_c",
             f"(2·{nd} + 8·{N})·{Tc}", (2 * rect + 2 * STATS * N) * Tc),
            ("read and write dQ: once per key tile", "2·N·d·s·T_c", f"2·{nd}·{Tc}", 2 * rect * Tc)]


def causal_skipped(B: int, H: int, N: int, d: int, s: int, t: Tiles, backward: bool) -> int:
    """Bytes the tiled pass no longer moves when, under a causal mask, it skips the tiles wholly
    above the diagonal (FlashAttention-2, §3.1.1): a query tile reads only the keys up to its
    last row; a key tile only the queries from its first row. Closed forms (any N at once): the
    forward's query tile i reads ⌈(i+1)·B_r/B_c⌉·B_c keys until that passes the last whole key
    tile, then all N; the backward's key tile j skips ⌊j·B_c/B_r⌋·B_r query rows."""
    Br, Bc = t.forward
    Tr, whole = -(-N // Br), min(-(-N // Br), N // Bc * Bc // Br)  # tiles, those inside whole key tiles
    rows = Bc * floor_sum(whole, Bc, Br, Br + Bc - 1) + (Tr - whole) * N
    saved = 2 * d * s * (Tr * N - rows)
    if backward:
        Br, Bc = t.backward
        Tc = -(-N // Bc)
        saved += (4 * d * s + 2 * STATS) * Br * floor_sum(Tc, Br, Bc, 0)
    return B * H * saved


def floor_sum(n: int, m: int, a: int, b: int) -> int:
    """Σ ⌊(a·i + b) / m⌋ for i from 0 to n − 1 (a, b ≥ 0, m ≥ 1), in a few steps of Euclid's
    algorithm instead of n (as in the AtCoder Library's floor_sum)."""
    total = 0
    while n > 0:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        top = a * n + b
        if top < m:
            break
        n, b = divmod(top, m)
        m, a = a, m
    return total


@dataclass(frozen=True)
class Io:
    """`cost --io`: every kernel's main-memory traffic in one layer, and how it was counted."""

    terms: list
    tiles: Tiles
    backward: bool
    causal: bool
    dropout: float
    skipped: int  # bytes the tiled pass saves by skipping the tiles above a causal diagonal
    reference: str | None  # a published measurement at these dimensions (the preset's)

    def total(self, path: str) -> int:
        return sum(t.bytes for t in self.terms if t.path == path)


def io(B: int, H: int, N: int, d: int, s: int, backward: bool = False, sram: int | None = None,
       block_q: int | None = None, block_k: int | None = None, causal: bool = False,
       dropout: float = 0.0, reference: str | None = None) -> Io:
    """The standard and the tiled pass's traffic at these sizes (`sram` defaults to an A100's)."""
    if not 0 <= dropout < 1:
        raise MhaError(f"dropout={dropout!r} must be a probability in [0, 1)", quantity="dropout")
    t = tiles(d, s, SRAM_A100 if sram is None else sram, block_q, block_k, N)
    skipped = causal_skipped(B, H, N, d, s, t, backward) if causal else 0
    return Io(traffic(B, H, N, d, s, t, backward, causal, dropout > 0), t, backward, causal,
              dropout, skipped, reference)
