"""`cost --io`: main-memory traffic, checked against what autograd's own kernels read and write,
against a simulation of FlashAttention-2's loops, and against Dao et al. 2022 (Fig. 2, Theorem 2)."""

import json
from math import log

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from mha_trace.core.hbm import STATS, Tiles, causal_skipped, floor_sum, io

FIG2 = dict(B=64, H=16, N=1024, d=64, s=2, backward=True, causal=True, dropout=0.1)  # GPT-2 medium


class KernelBytes(TorchDispatchMode):
    """Each kernel torch runs, with the bytes of every tensor it reads or writes (views move none)."""

    def __init__(self):
        super().__init__()
        self.kernels = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func.is_view and func not in (torch.ops.aten.detach.default, torch.ops.aten._unsafe_view.default):
            tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
            self.kernels.append((str(func), sum(t.numel() * t.element_size() for t in tensors)))
        return out


def standard_kernels(B, H, N, d, dtype, causal, dropout, backward):
    """Standard attention in eager torch on the meta device, one kernel a step: the mask a kernel
    that reads S and writes it (tril moves the same bytes as a causal fill computed from indices),
    dropout torch's fused one, and autograd's own backward."""
    q, v = (torch.empty(B, H, N, d, device="meta", dtype=dtype, requires_grad=True) for _ in range(2))
    k_t = torch.empty(B, H, d, N, device="meta", dtype=dtype, requires_grad=True)
    grad = torch.empty(B, H, N, d, device="meta", dtype=dtype)
    with KernelBytes() as counted:
        scores = q @ k_t
        scores = scores.tril() if causal else scores
        weights = scores.softmax(-1)
        weights = torch.native_dropout(weights, dropout, True)[0] if dropout else weights
        out = weights @ v
        if backward:
            out.backward(grad)
    return counted.kernels


@pytest.mark.parametrize("causal,dropout,backward", [(False, 0.0, False), (True, 0.1, False),
                                                     (False, 0.0, True), (True, 0.1, True),
                                                     (True, 0.0, True), (False, 0.2, True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_the_standard_count_is_what_each_kernel_reads_and_writes(causal, dropout, backward, dtype):
    B, H, N, d = 2, 3, 37, 8
    kernels = standard_kernels(B, H, N, d, dtype, causal, dropout, backward)
    terms = [t for t in io(B, H, N, d, dtype.itemsize, backward, causal=causal, dropout=dropout).terms
             if t.path == "standard"]
    assert [t.bytes for t in terms] == [n for _, n in kernels], (terms, kernels)


def flash2_loops(N, d, s, t: Tiles, backward, causal):
    """FlashAttention-2's Algorithms 1 and 2 (Dao 2023) walked tile by tile, counting every load
    from and store to HBM; under `causal`, tiles wholly above the diagonal are skipped."""
    moved = 0
    Br, Bc = t.forward
    for q0 in range(0, N, Br):
        rows = min(Br, N - q0)
        moved += rows * d * s  # load Q_i
        for k0 in range(0, N, Bc):
            if causal and k0 > q0 + rows - 1:
                break
            moved += 2 * min(Bc, N - k0) * d * s  # load K_j, V_j
        moved += rows * d * s + rows * STATS  # store O_i, L_i
    if backward:
        moved += 2 * N * d * s + N * STATS  # D = rowsum(dO∘O)
        Br, Bc = t.backward
        for k0 in range(0, N, Bc):
            cols = min(Bc, N - k0)
            moved += 2 * cols * d * s  # load K_j, V_j
            for q0 in range(0, N, Br):
                rows = min(Br, N - q0)
                if causal and q0 + rows - 1 < k0:
                    continue
                moved += 2 * rows * d * s + 2 * rows * STATS  # load Q_i, dO_i, L_i, D_i
                moved += 2 * rows * d * s  # load and store dQ_i
            moved += 2 * cols * d * s  # store dK_j, dV_j
    return moved


@pytest.mark.parametrize("N,d,s,blocks", [(1024, 64, 2, None), (1000, 64, 2, (128, 96)),
                                          (37, 8, 4, (5, 7)), (300, 32, 2, (64, 64)), (9, 4, 4, (16, 2))])
@pytest.mark.parametrize("backward", [False, True])
def test_the_tiled_count_is_flashattention2s_loops_tile_by_tile(N, d, s, blocks, backward):
    B, H = 3, 2
    counted = io(B, H, N, d, s, backward, block_q=blocks and blocks[0], block_k=blocks and blocks[1],
                 causal=True)
    assert counted.total("tiled") == B * H * flash2_loops(N, d, s, counted.tiles, backward, False)
    skipped = B * H * flash2_loops(N, d, s, counted.tiles, backward, True)
    assert counted.total("tiled") - counted.skipped == skipped


def test_gpt2_medium_against_dao_et_al_2022_figure_2():
    """Fig. 2 left, measured on an A100: standard 40.3 GB, FlashAttention 4.4 GB (9.2×)."""
    counted = io(**FIG2)
    standard, tiled = counted.total("standard"), counted.total("tiled")
    assert 0.85 * 40.3e9 <= standard <= 1.15 * 40.3e9
    assert 5 <= standard / tiled <= 15
    assert counted.tiles.forward == (384, 64) and counted.tiles.backward == (64, 384)  # 192 KB of SRAM


def test_accesses_fall_as_the_block_grows():
    """Fig. 2 middle: fewer HBM accesses with larger blocks."""
    totals = [io(**FIG2, block_q=b, block_k=b).total("tiled") for b in (64, 128, 256, 512)]
    assert totals == sorted(totals, reverse=True) and len(set(totals)) == 4
    assert len({io(**FIG2, block_q=b, block_k=b).total("standard") for b in (64, 512)}) == 1


def slope(xs, ys):
    return np.polyfit([log(x) for x in xs], [log(y) for y in ys], 1)[0]


def test_theorem_2_the_tiled_pass_moves_n2_d2_over_m():
    """Θ(N²d²/M): on a log-log fit, slope 2 in N, -1 in M (and 2 in d), where the quadratic term rules."""
    tiled = lambda N, d, M: io(1, 1, N, d, 2, backward=True, sram=M).total("tiled")
    Ns, Ms, ds = [2 ** k for k in range(14, 19)], [2 ** k for k in range(15, 20)], [32, 64, 128]
    assert 1.9 <= slope(Ns, [tiled(N, 64, 2 ** 16) for N in Ns]) <= 2.0
    assert -1.0 <= slope(Ms, [tiled(2 ** 18, 64, M) for M in Ms]) <= -0.9
    assert 1.9 <= slope(ds, [tiled(2 ** 18, d, 2 ** 20) for d in ds]) <= 2.0
    standard = lambda N: io(1, 1, N, 64, 2, backward=True).total("standard")
    assert 1.95 <= slope(Ns, [standard(N) for N in Ns]) <= 2.0  # Θ(N²) whatever the SRAM


@pytest.mark.parametrize("width", [80, 100, 120])
def test_cost_io_golden(cli, golden, width):
    args = ("cost", "--preset", "gpt2-medium", "--batch", "64", "--dtype", "float16", "--io", "--backward")
    text = cli(*args, "--width", str(width)).stdout
    assert max(len(line) for line in text.splitlines()) <= width
    golden(f"cost_io_gpt2_medium_{width}.txt", text)


def test_cost_io_json_and_formulas(cli):
    data = json.loads(cli("cost", "--preset", "gpt2-medium", "--batch", "64", "--dtype", "float16",
                          "--io", "--backward", "--format", "json").stdout)["io"]
    assert data["standard_bytes"] == sum(t["bytes"] for t in data["terms"] if t["path"] == "standard")
    assert data["standard_bytes"] == io(**FIG2).total("standard") and data["tiled_bytes"] == io(**FIG2).total("tiled")
    assert 0.85 * 40.3e9 <= data["standard_bytes"] <= 1.15 * 40.3e9 and 5 <= data["standard_bytes"] / data["tiled_bytes"] <= 15
    assert data["tiles"]["forward"] == {"block_q": 384, "block_k": 64} and data["published"].startswith("Dao")
    text = cli("cost", "--seq", "100", "--io", "--block-q", "32", "--block-k", "16", "--formulas",
               "--width", "200").stdout
    assert "B·H·(2·N·d·s·T_r) = 2·8·(2·100·64·4·4)" in text  # T_r = ⌈100/32⌉ = 4
    table = text.split("Main-memory")[1].split("Standard ")[0]
    assert "mask S" not in table and "dropout" not in table and " backward " not in table


def test_the_causal_skip_in_closed_form_is_the_loop_for_every_tiling():
    """The closed form (a floor sum, any N at once) against the tile-by-tile loop, for every
    pair of tiles of a few small N: square, tall, wide, larger than N, N not a multiple."""
    for N in (1, 2, 7, 12, 31):
        for Br in range(1, N + 2):
            for Bc in range(1, N + 2):
                t = Tiles((min(Br, N), min(Bc, N)), (min(Bc, N), min(Br, N)), "")
                for backward in (False, True):
                    whole = flash2_loops(N, 4, 2, t, backward, False)
                    assert causal_skipped(1, 1, N, 4, 2, t, backward) == \
                        whole - flash2_loops(N, 4, 2, t, backward, True), (N, Br, Bc, backward)


def test_a_floor_sum_is_the_sum_it_names():
    for n, m, a, b in [(0, 3, 1, 1), (1, 1, 0, 0), (10, 3, 7, 5), (37, 5, 12, 4), (100, 97, 96, 200)]:
        assert floor_sum(n, m, a, b) == sum((a * i + b) // m for i in range(n))


def test_any_size_is_counted_at_once_or_refused_in_one_line(cli):
    """A causal count over 2³¹ positions in tiles of one (a loop over 2⁶² tiles before), and an
    SRAM of 400 digits (an OverflowError before): a result, or one line."""
    huge = cli("cost", "--io", "--causal", "--seq", "2147483647", "--block-q", "1", "--block-k", "1",
               "--backward", "--format", "json")
    assert huge.exit_code == 0, huge.stderr
    assert 0 < json.loads(huge.stdout)["io"]["tiled_bytes_skipping_causal_tiles"]
    sram = cli("cost", "--io", "--sram", "9" * 400)
    assert (sram.exit_code, sram.stderr) == (2, "Error: --sram is more on-chip memory than any chip has: at "
                                                "most 1,099,511,627,776 bytes (an A100 has 196,608 a multiprocessor)\n")
    digits = cli("cost", "--seq", "9" * 5000)
    assert digits.exit_code == 2 and len(digits.stderr) < 200


@pytest.mark.parametrize("args,message", [
    (("--block-q", "64"), "--block-q counts main-memory traffic: add --io"),
    (("--sram", "98304"), "--sram counts main-memory traffic: add --io"),
    (("--backward",), "--backward counts main-memory traffic: add --io"),
    (("--dropout", "0.1"), "--dropout counts main-memory traffic: add --io"),
    (("--causal",), "--causal counts main-memory traffic: add --io"),
    (("--io", "--block-k", "0"), "--block-k: block_k=0 must be a positive integer"),
    (("--io", "--dropout", "1"), "--dropout: dropout=1.0 must be a probability in [0, 1)"),
    (("--io", "--sram", "100"), "--sram: sram=100 bytes holds less than a tile of 2 rows of d_k=64 "
                                "(at least 2048 bytes)"),
])
def test_cost_io_bad_input(cli, args, message):
    result = cli("cost", *args)
    assert (result.exit_code, result.stderr) == (2, f"Error: {message}\n")
