"""One query row through FlashAttention-2's loop (`explain --impl tiled`): the keys come in tiles,
and for each tile the running max m, the rescale exp(m_old − m_new), the tile's exp(s − m), the
running sum ℓ and the output not yet divided by ℓ, number by number, in NumPy (float64) from a
walk's own scores and values. The chapter's exercise 1, done the tiled way. Plain data.
"""

import math
from dataclasses import dataclass

import numpy as np

from mha_trace.analyses.walk import Walk
from mha_trace.errors import MhaError
from mha_trace.records import Shows


@dataclass
class Tile:
    keys: list  # the key tokens of this tile
    scores: list  # q·k ÷ √d_k; -inf where masked
    m_old: float
    m_new: float  # max(m_old, the tile's max)
    rescale: float  # exp(m_old − m_new): what the sums so far are multiplied by
    p: list  # exp(score − m_new), each key's weight before dividing by ℓ
    l_old: float
    l_new: float  # rescale · ℓ_old + Σ p
    o: np.ndarray  # (d_k,) rescale · o_old + Σ p · v, not yet divided by ℓ


@dataclass
class TiledHead:
    head: int  # 1-based
    tiles: list
    output: np.ndarray  # o ÷ ℓ after the last tile
    explicit: np.ndarray  # the walk's own softmax(scores) · V
    lse: float  # L = m + log ℓ, kept for the backward pass
    reference_lse: float  # log Σ exp(score) over the keys the query may see, at once


@dataclass
class TiledWalk(Shows):
    walk: Walk
    block_k: int
    heads: list


def tiled_walk(w: Walk, block_k: int | None = None) -> TiledWalk:
    """The walk's query row, key tile by key tile (default: two tiles)."""
    T = len(w.heads[0].terms)
    block_k = -(-T // 2) if block_k is None else block_k
    if type(block_k) is not int or block_k < 1:
        raise MhaError(f"block_k={block_k!r} must be a positive integer (at least 1)",
                       quantity="block_k")
    return TiledWalk(w, min(block_k, T), [_head(hw, min(block_k, T)) for hw in w.heads])


def _head(hw, block_k: int) -> TiledHead:
    scores = np.array([-math.inf if t.masked else t.scaled for t in hw.terms])
    m, l, o, tiles = -math.inf, 0.0, np.zeros(hw.values.shape[1]), []
    for j in range(0, len(scores), block_k):
        s = scores[j:j + block_k]
        m_new = max(m, float(s.max()))
        shift = 0.0 if m_new == -math.inf else m_new  # a row that has seen no key yet
        rescale, p = math.exp(m - shift), np.exp(s - shift)
        l_new = rescale * l + float(p.sum())
        o = rescale * o + p @ hw.values[j:j + block_k]
        tiles.append(Tile([t.token for t in hw.terms[j:j + block_k]], s.tolist(), m, m_new,
                          rescale, p.tolist(), l, l_new, o))
        m, l = m_new, l_new
    output = o / l if l else np.zeros_like(o)
    seen = scores[scores > -math.inf]
    reference = float(np.logaddexp.reduce(seen)) if len(seen) else -math.inf
    return TiledHead(hw.head, tiles, output, hw.output, m + math.log(l) if l else -math.inf,
                     reference)
