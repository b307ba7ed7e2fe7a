"""The caches the KV-cache lab compares, and what each lets a query see.

A `Setting` is a policy at a budget. `full`, `window` and `sinks` keep positions alone
(`kept_positions`, `position_mask`). `PolicyCache` is one layer's caches for several settings at
once, as decoding fills them, evicting from each full row; `replay` runs its evictions over a
layer's attention weights without decoding (what h2o keeps depends on the weights the keys get).
"""

from dataclasses import dataclass

import numpy as np
import torch

from mha_trace.core.attention import rope, rotate_half

POLICIES = ("full", "window", "sinks", "h2o")


@dataclass(frozen=True)
class Setting:
    policy: str
    budget: int | None  # None: full
    sinks: int
    renumber: bool = False


def kept_positions(s: Setting, t: int) -> np.ndarray:
    """The positions a query at t sees under a policy that depends on positions alone."""
    seen = np.arange(t + 1)
    if s.policy == "full" or s.budget is None or t < s.budget:
        return seen
    if s.policy == "window":
        return seen[t - s.budget + 1:]
    return np.concatenate([seen[:s.sinks], seen[t - (s.budget - s.sinks) + 1:]])  # sinks


def position_mask(s: Setting, T: int) -> torch.Tensor:
    """(T, T) bool: True where query t sees key j."""
    mask = torch.zeros(T, T, dtype=torch.bool)
    for t in range(T):
        mask[t, kept_positions(s, t)] = True
    return mask


def turn(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """x (R, H, W, d) turned by RoPE, each slot at its own position (R, H, W): `rope` at
    positions that differ by row and head (angles in float64)."""
    d = x.size(-1)
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float64, device=x.device) / d)
    angles = positions.double()[..., None] * inv_freq  # (R, H, W, d/2)
    angles = torch.cat([angles, angles], dim=-1)
    return x * angles.cos().to(x.dtype) + rotate_half(x) * angles.sin().to(x.dtype)


class PolicyCache:
    """One layer's KV caches for several settings at once, a batch row each (every row reads the
    same text), in buffers as wide as the largest budget. Row r holds at most its budget B_r
    tokens, the one being read included: once full, each new token takes the slot of the one
    it evicts. `position` is the new token's position, a 0-dim tensor on the device that every
    layer's cache shares and the decoding loop moves on (so that a CUDA graph of a step replays
    at each step's position); `visible()` the slots each row's query sees; `append` evicts from
    each full row, adds the new token and returns every row's keys and values; `observe` takes
    the step's weights (h2o counts what each key received). All of it is index operations on
    tensors: no loop over rows, heads or slots, no copy of the kept keys, and nothing read back
    to the host while decoding."""

    def __init__(self, settings: list, group: int, rope_base: float, tokens: int,
                 position: torch.Tensor):
        self.group, self.base, self.position = group, rope_base, position
        device = position.device
        self.budgets = [min(s.budget or tokens, tokens) for s in settings]
        self.width = max(self.budgets)
        row = lambda values: torch.tensor(values, device=device)[:, None, None]  # (R, 1, 1)
        self.last = row(self.budgets)[:, 0, 0] - 1  # (R,) the last slot of each row
        self.sinks = row([s.sinks for s in settings])
        self.recent = row([b // 2 - 1 for b in self.budgets])  # h2o: with the next token, B/2
        self.kept_from = row([0 if s.policy == "window" else s.sinks for s in settings])
        self.h2o = row([s.policy == "h2o" for s in settings])[..., 0]  # (R, 1)
        self.renumbered = torch.tensor([s.renumber for s in settings], device=device)
        self.renumbering = any(s.renumber for s in settings)
        self.slot_index = torch.arange(self.width, device=device)  # (W,)
        self.k = self.v = None  # (R, Hkv, W, d_k): kept keys (turned at their position, or held
        self.positions: torch.Tensor = None  # unturned when renumbering); (R, Hkv, W) each's
        self.score: torch.Tensor = None
        # position (-1: empty) and the attention it received so far (h2o)

    def visible(self) -> torch.Tensor:
        """(R, 1, 1, W) bool: the slots the next token's query sees in each row, itself included."""
        return (self.slot_index <= torch.minimum(self.last, self.position)[:, None])[:, None, None]

    def place(self, kv_heads: int) -> torch.Tensor:
        """Evict from each full row and give the new token, at `position`, a slot per K/V head:
        (R, Hkv) the slots, its position written there and its received attention set to 0."""
        if self.positions is None:
            shape, device = (len(self.budgets), kv_heads, self.width), self.position.device
            self.positions = torch.full(shape, -1, dtype=torch.long, device=device)
            self.score = torch.zeros(shape, dtype=torch.float64, device=device)
        t = self.position
        slot = torch.where((self.last < t)[:, None], self._evicted(t), t)  # (R, Hkv)
        self.positions.scatter_(2, slot[..., None], t.expand(slot[..., None].shape))
        self.score.scatter_(2, slot[..., None], 0.0)
        return slot

    def append(self, k, v):
        """This step's keys and values (R, Hkv, 1, d_k), turned at `position`; every
        row's kept ones with them (R, Hkv, W, d_k), each full row having evicted one first."""
        if self.k is None:
            R, G, _, d = k.shape
            self.k, self.v = k.new_zeros(R, G, self.width, d), v.new_zeros(R, G, self.width, d)
        t, slot = self.position, self.place(k.size(1))
        if self.renumbering:  # held unturned: turned by their rank at each step
            k = torch.where(self.renumbered[:, None, None, None], rope(k, -t, self.base), k)
        at = lambda x: slot[..., None, None].expand(-1, -1, 1, x.size(-1))
        self.k.scatter_(2, at(k), k)
        self.v.scatter_(2, at(v), v)
        return self._keys(t), self.v

    def _evicted(self, t: torch.Tensor) -> torch.Tensor:
        """(R, Hkv) the slot each full row gives up: window its oldest token, sinks its oldest
        after the sinks, h2o the one that received least of those after the sinks and before
        the recent B/2 (per K/V head)."""
        p = self.positions
        oldest = torch.where(p >= self.kept_from, p, self.width + t).argmin(-1)
        middle = (p >= self.sinks) & (p < t - self.recent)
        lightest = torch.where(middle, self.score, torch.inf).argmin(-1)
        return torch.where(self.h2o, lightest, oldest)

    def _keys(self, t: torch.Tensor) -> torch.Tensor:
        """The keys as each row's query reads them: a renumbered row's turned by their rank in
        the cache, shifted so that its query, turned at t, sits at its own rank (RoPE sees only
        differences)."""
        if not self.renumbering:
            return self.k
        empty = (self.positions < 0).sum(-1, keepdim=True)
        rank = self.positions.argsort(-1).argsort(-1) - empty  # (R, Hkv, W)
        newest = torch.minimum(self.last, t)[:, None, None]
        turned = turn(self.k, rank + (t - newest), self.base)
        return torch.where(self.renumbered[:, None, None, None], turned, self.k)

    def observe(self, weights) -> None:
        """weights (R, H, 1, W): add the attention each K/V head's keys received (h2o)."""
        R, H, _, W = weights.shape
        self.score += weights[:, :, 0].double().view(R, H // self.group, self.group, W).sum(2)


def replay(cache: PolicyCache, weights: torch.Tensor) -> torch.Tensor:
    """What each query of a layer sees under the cache's evictions, without decoding:
    weights (R, H, T, T) are the layer's over every earlier key (the causal mask). At each
    position in turn the cache evicts and places the token as decoding would, and observes the
    weights its query gives the keys it holds, renormalised over them (what softmax gives over
    those keys alone). (R, H, T, T) bool: True where query t sees key j, as decoding's cache
    holds it. Exactly decoding's choices while no setting renumbers: a query's weights over the
    keys it sees do not depend on which others were evicted. On CUDA the step replays from a
    graph (`runtime.replayed`)."""
    from mha_trace.core.runtime import replayed

    R, H, T, _ = weights.shape
    G = H // cache.group  # K/V heads
    seen = torch.zeros(R, G, T, T + 1, dtype=torch.bool, device=weights.device)  # column 0: empty
    flat, t = seen.view(R, G, -1), cache.position

    def step():
        cache.place(G)
        p = cache.positions  # (R, Hkv, W): each slot's position, -1 where empty
        row = weights.index_select(2, t.view(1))[:, :, 0]  # (R, H, T): the query at t's weights
        held = (p >= 0).repeat_interleave(cache.group, 1)  # (R, H, W)
        got = row.gather(-1, p.clamp(min=0).repeat_interleave(cache.group, 1)) * held
        cache.observe((got / got.sum(-1, keepdim=True))[:, :, None])  # (R, H, 1, W)
        flat.scatter_(-1, t * (T + 1) + p + 1, True)
        t.add_(1)

    step = replayed(step, weights.device)
    for _ in range(T):
        step()
    return seen[..., 1:].repeat_interleave(cache.group, 1)
