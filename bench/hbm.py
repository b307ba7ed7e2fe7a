"""Main-memory traffic of attention (`cost --io`) against Dao et al. 2022, "FlashAttention".

    python bench/hbm.py

Prints GPT-2 medium's count beside Fig. 2 left (standard 40.3 GB, FlashAttention 4.4 GB, forward
and backward, batch 64, float16), the tiled count as the block grows (Fig. 2 middle), and the
slopes of a log-log fit that Theorem 2's Θ(N²d²/M) predicts: 2 in N, -1 in M. Arithmetic only:
no torch, well under a second.
"""

from math import log

from mha_trace.core.hbm import io

GPT2_MEDIUM = dict(B=64, H=16, N=1024, d=64, s=2, backward=True, causal=True, dropout=0.1)


def slope(xs, ys) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = [log(x) for x in xs], [log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def main() -> None:
    counted = io(**GPT2_MEDIUM)
    standard, tiled = counted.total("standard"), counted.total("tiled")
    print("GPT-2 medium, forward + backward, batch 64, float16, 192 KB of SRAM:")
    print(f"  standard {standard / 1e9:.2f} GB (Fig. 2: 40.3 GB, {standard / 40.3e9 - 1:+.1%})")
    print(f"  tiled    {tiled / 1e9:.2f} GB (Fig. 2: 4.4 GB), ratio {standard / tiled:.1f}x (Fig. 2: 9.2x)")
    skipping = tiled - counted.skipped
    print(f"  tiled, causal tiles skipped: {skipping / 1e9:.2f} GB, ratio {standard / skipping:.1f}x")
    print("Block size (B_r = B_c), as Fig. 2 middle:")
    for block in (64, 128, 256, 512):
        moved = io(**GPT2_MEDIUM, block_q=block, block_k=block).total("tiled")
        print(f"  {block:4d}: {moved / 1e9:.2f} GB")
    tiled_at = lambda N, M: io(1, 1, N, 64, 2, backward=True, sram=M).total("tiled")
    Ns, Ms = [2 ** k for k in range(14, 19)], [2 ** k for k in range(15, 20)]
    print("Theorem 2, Θ(N²d²/M), on a log-log fit (d = 64, float16):")
    print(f"  slope in N (M = 64 KiB, N = 16K..256K): {slope(Ns, [tiled_at(N, 2 ** 16) for N in Ns]):.3f}")
    print(f"  slope in M (N = 256K, M = 32 KiB..512 KiB): {slope(Ms, [tiled_at(2 ** 18, M) for M in Ms]):.3f}")


if __name__ == "__main__":
    main()
