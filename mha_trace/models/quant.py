"""GGUF's quantised blocks back to float32, in torch, straight from the memory-mapped file.

gguf's own `gguf.quants.dequantize` is the reference (the tests check these are equal to it, bit
for bit); it is numpy and about three times slower, which a forward pass through 30 layers feels.
Each takes the device to dequantise on: the file's blocks go there as they are (about a sixth of the
float32 bytes) and become float32 there, with the same operations, in place: a command dequantises
each layer on each pass, and every temporary's fresh pages cost more than the arithmetic on them.

    Q4_1 block (20 bytes, 32 weights): d (f16), m (f16), 16 bytes of 4-bit q; w = q·d + m
    Q8_0 block (34 bytes, 32 weights): d (f16), 32 int8 q;                     w = q·d
"""

import numpy as np
import torch


def _blocks(raw: np.ndarray, size: int, device) -> torch.Tensor:
    """(rows, row_bytes) uint8 -> (rows, blocks, size) on `device` (on the CPU without copying
    the file's bytes)."""
    return torch.from_numpy(np.asarray(raw)).to(device).view(raw.shape[0], -1, size)


def q4_1(raw: np.ndarray, device="cpu") -> torch.Tensor:
    b = _blocks(raw, 20, device)
    d = b[..., 0:2].contiguous().view(torch.float16).float()  # (rows, blocks, 1)
    m = b[..., 2:4].contiguous().view(torch.float16).float()
    q, w = b[..., 4:20], torch.empty(*b.shape[:2], 32, dtype=torch.float32, device=b.device)
    w[..., :16], w[..., 16:] = q & 0x0F, q >> 4  # low nibbles are weights 0-15, high 16-31
    return w.mul_(d).add_(m).view(raw.shape[0], -1)  # in place: w the only float32 weights made


def q8_0(raw: np.ndarray, device="cpu") -> torch.Tensor:
    b = _blocks(raw, 34, device)
    d = b[..., 0:2].contiguous().view(torch.float16).float()
    q = b[..., 2:34].contiguous().view(torch.int8).float()
    return q.mul_(d).view(raw.shape[0], -1)


def f32(raw: np.ndarray, device="cpu") -> torch.Tensor:
    """A float32 tensor: (rows, row_bytes) -> (rows, row_bytes / 4); a vector stays a vector."""
    values = torch.from_numpy(np.asarray(raw).view(np.float32).copy()).to(device)
    return values.view(-1) if values.shape[-1] == 1 else values


DEQUANTISE = {"Q4_1": q4_1, "Q8_0": q8_0, "F32": f32}
BLOCK = {"Q4_1": (32, 20), "Q8_0": (32, 34), "F32": (1, 4)}  # weights per block, bytes per block
