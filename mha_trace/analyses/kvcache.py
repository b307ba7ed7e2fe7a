"""The KV-cache lab: a text decoded under caches that keep at most B tokens, and what each
eviction policy costs in next-token loss.

Policies (B the budget, S the sinks; the token being read always counts as one of the B):
  full    every token (the reference);
  window  the last B tokens;
  sinks   the first S and the last B - S (StreamingLLM, Xiao et al. 2023);
  h2o     the first S, the last B/2, and the rest the keys that received the most attention so
          far, per K/V head (Heavy-Hitter Oracle, Zhang et al. 2023).

Keys keep their original RoPE positions (the cache holds rotated keys), so for `full`, `window`
and `sinks` what a query sees depends on positions alone: one forward pass with that mask is
exactly token-by-token decoding (tested). `h2o` and `renumber` (positions counted inside the
cache, as StreamingLLM does) decode for real, one token at a time, through the lecture's
attention module with a cache that evicts (`PolicyCache`): every such setting at once, a batch
row each, so the weights are read once a token for all of them.
"""

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mha_trace.core.attention import rope, rotate_half
from mha_trace.errors import MhaError
from mha_trace.models.base import ModelCard
from mha_trace.records import Shows

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
        self.positions = self.score = None  # unturned when renumbering); (R, Hkv, W) each's
        # position (-1: empty) and the attention it received so far (h2o)

    def visible(self) -> torch.Tensor:
        """(R, 1, 1, W) bool: the slots the next token's query sees in each row, itself included."""
        return (self.slot_index <= torch.minimum(self.last, self.position)[:, None])[:, None, None]

    def append(self, k, v):
        """This step's keys and values (R, Hkv, 1, d_k), turned at `position`; every
        row's kept ones with them (R, Hkv, W, d_k), each full row having evicted one first."""
        if self.k is None:
            R, G, _, d = k.shape
            self.k, self.v = k.new_zeros(R, G, self.width, d), v.new_zeros(R, G, self.width, d)
            self.positions = torch.full((R, G, self.width), -1, dtype=torch.long, device=k.device)
            self.score = torch.zeros(R, G, self.width, dtype=torch.float64, device=k.device)
        t = self.position
        slot = torch.where((self.last < t)[:, None], self._evicted(t), t)  # (R, Hkv)
        if self.renumbering:  # held unturned: turned by their rank at each step
            k = torch.where(self.renumbered[:, None, None, None], rope(k, -t, self.base), k)
        at = lambda x: slot[..., None, None].expand(-1, -1, 1, x.size(-1))
        self.k.scatter_(2, at(k), k)
        self.v.scatter_(2, at(v), v)
        self.positions.scatter_(2, slot[..., None], t.expand(slot[..., None].shape))
        self.score.scatter_(2, slot[..., None], 0.0)
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


@dataclass(frozen=True)
class CacheResult:
    setting: Setting
    nll: float  # mean negative log-likelihood per predicted token, nats
    seconds: float
    held: np.ndarray  # (positions,) share of layer × K/V heads holding each position at the end
    decoded: bool  # token by token (else one masked pass)
    first_share: float | None = None  # mean weight on position 0 (queries 1.., every head)

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.nll))


@dataclass
class CacheLab(Shows):
    renderer = "mha_trace.render.kvcache"  # how it shows, imported when first shown

    model: object
    text_name: str
    ids: list
    results: list = field(default_factory=list)  # [CacheResult]
    sinks: int = 4

    @property
    def full(self) -> CacheResult:
        return next(r for r in self.results if r.setting.policy == "full")

    @property
    def first_share(self) -> float | None:
        return self.full.first_share

    @property
    def even_share(self) -> float:
        """The first token's share if every query spread its weight evenly: mean of 1/(t+1)."""
        return float(np.mean(1 / np.arange(2, len(self.ids) + 1)))


def _nll(model, hidden: torch.Tensor, ids: list) -> float:
    """Mean next-token negative log-likelihood over positions 0 .. T-2 of (1, T, D) outputs."""
    logits = model.unembed(hidden[0, :-1]).double()
    targets = torch.tensor(ids[1:], device=logits.device)
    return float(torch.nn.functional.cross_entropy(logits, targets))


def masked_pass(model, ids: list, s: Setting) -> CacheResult:
    start = time.perf_counter()
    with torch.no_grad():
        out, _, weights = model.run(ids, mask=position_mask(s, len(ids)).to(model.device))
    nll = _nll(model, out, ids)
    held = np.zeros(len(ids))
    held[kept_positions(s, len(ids) - 1)] = 1.0
    first = float(torch.stack([w[0, :, 1:, 0].mean() for w in weights]).mean())
    return CacheResult(s, nll, time.perf_counter() - start, held, decoded=False, first_share=first)


def decode(model, ids: list, todo: list, on_token=lambda: None) -> list:
    """Token by token through every layer, every setting at once (a batch row each), each layer
    with its own PolicyCache; a row's query sees the keys its cache holds for it. Every token's
    input is embedded once; on CUDA the step is replayed from a graph (`runtime.replayed`). One
    result a setting, each with an even share of the time (they ran together)."""
    from mha_trace.core.runtime import replayed

    start = time.perf_counter()
    group = model.heads // (model.kv_heads or model.heads)
    clock = torch.zeros((), dtype=torch.long, device=model.device)  # the token's position
    caches = [PolicyCache(todo, group, model.rope_base, len(ids), clock) for _ in range(model.layers)]
    rows = [ids[:1]] * len(todo)  # the step's shape, one token a row: its input comes from x
    with torch.no_grad(), model.resident():
        embedded = sum(model.embedding_parts(ids).values())  # (T, D): every token's input
        x = embedded.new_empty(len(todo), 1, embedded.size(-1))  # (R, 1, D): the step's

        def step():
            out, _, weights = model.run(rows, resume=(1, x), caches=caches, mask=caches[0].visible())
            for cache, w in zip(caches, weights):
                cache.observe(w)
            clock.add_(1)  # in place: a replay moves it on too
            return out

        step, outputs = replayed(step, model.device), []
        for t in range(len(ids)):
            x.copy_(embedded[t].expand_as(x))
            outputs.append(step().clone())  # a replay writes its output where the last one was
            on_token()
    out = torch.cat(outputs, 1)  # (R, T, D)
    nll = [_nll(model, out[r:r + 1], ids) for r in range(len(todo))]
    seconds = (time.perf_counter() - start) / len(todo)
    return [CacheResult(s, nll[r], seconds, _held(caches, r, len(ids)), decoded=True)
            for r, s in enumerate(todo)]


def _held(caches: list, row: int, T: int) -> np.ndarray:
    """(T,) the share of layer × K/V heads whose cache holds each position at the end."""
    held = np.zeros(T)
    for c in caches:
        positions = c.positions[row].cpu().numpy()  # (Hkv, W), -1 where empty
        np.add.at(held, positions[positions >= 0], 1.0 / (len(caches) * len(positions)))
    return held


def settings(policies: list, budgets: list, sinks: int, renumber: bool) -> list:
    """full once (always: every other loss is measured against it), then each other policy at
    each budget (and renumbered, with --renumber)."""
    out = [Setting("full", None, sinks)]
    for b in budgets:
        for p in (p for p in policies if p != "full"):
            out.append(Setting(p, b, sinks))
            if renumber:
                out.append(Setting(p, b, sinks, renumber=True))
    return out


def check_settings(policies: list, budgets: list, sinks: int) -> None:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        raise MhaError(f"policy '{unknown[0]}' is not one of {', '.join(POLICIES)}",
                       quantity="policy")
    for b in budgets:
        if b < 2 * sinks + 2:
            raise MhaError(f"budget {b} leaves no room beside {sinks} sinks and the recent tokens "
                           f"(at least {2 * sinks + 2}, or fewer --sinks)", quantity="budget")


DECODE_SECONDS = (0.06, 0.01)  # a token through SmolLM2 with a cache, 2 cores (bench/cache.py),
TRAINED_DECODE_SECONDS = (0.002, 0.0005)  # and each further setting decoded with it; a trained
# run's few small layers
LIMIT_SECONDS = 600  # the lab's time guard


def decoded(s: Setting) -> bool:
    """Whether a setting needs real decoding: what h2o keeps depends on attention, and
    renumbering changes the positions a key is turned by."""
    return s.policy == "h2o" or (s.renumber and s.policy != "full")


def text_ids(model, text: str, tokens: int) -> list:
    """BOS, then the text's tokens without special tokens, the first `tokens` in all; a trained
    run's text is its token ids written out."""
    if not model.capabilities.text:
        return model.tokenize(text)[:tokens]
    return ([model.bos] + model.tokenizer.encode(text, add_special_tokens=False).ids)[:tokens]


def step_seconds(model, rows: int) -> float:
    """A token decoded through every layer for `rows` settings at once (a batch row each), on
    2 cores."""
    first, more = DECODE_SECONDS if model.capabilities.text else TRAINED_DECODE_SECONDS
    return first + more * (max(rows, 1) - 1)


def lab_seconds(model, T: int, todo: list) -> float:
    """The lab's estimate on 2 cores: a masked pass for each setting that has one, and the
    decoded settings' tokens, all of them together."""
    from mha_trace.models.guards import seconds

    rows = sum(decoded(s) for s in todo)
    return (len(todo) - rows) * seconds(model, T) + (T * step_seconds(model, rows) if rows else 0)


def check_lab_time(model, T: int, todo: list) -> float:
    """The lab's estimate on 2 cores, refused past LIMIT_SECONDS unless --max-seconds raises it."""
    estimate, limit = lab_seconds(model, T, todo), model.limits.seconds(LIMIT_SECONDS)
    if estimate > limit:
        raise MhaError(f"cache would run {len(todo)} settings over {T} tokens: about "
                       f"{estimate / 60:.0f} min on 2 cores, and the guard stops at "
                       f"{limit / 60:g} min; fewer --tokens, budgets or policies, or "
                       f"--max-seconds {estimate + 1:.0f} goes on anyway", quantity="tokens")
    return estimate


def run_lab(model, text_name: str, ids: list, todo: list, on_token=lambda: None) -> CacheLab:
    """Every setting over the text: a masked pass where it is exact, else real decoding, every
    decoded setting at once. on_token() is called once a decoded token, and for a masked pass as
    often as the decoded tokens its time is worth (`pass_work`): a progress bar's estimate then
    holds steady."""
    from mha_trace.speedups import batch_work

    lab, found = CacheLab(ModelCard.of(model), text_name, ids, sinks=todo[0].sinks), {}
    real = [s for s in todo if decoded(s)]
    with model.resident(), batch_work():  # the weights dequantised once; every core, and the
        # heap for temporaries (a 512-token pass's weights; a batch of caches)
        for s in (s for s in todo if not decoded(s)):
            found[s] = masked_pass(model, ids, s)
            for _ in range(pass_work(model, len(ids), todo)):
                on_token()
        found |= dict(zip(real, decode(model, ids, real, on_token) if real else []))
    lab.results = [found[s] for s in todo]
    return lab


def pass_work(model, T: int, todo: list) -> int:
    """A masked pass's share of the lab in decoded tokens (each a token through every decoded
    setting at once): its estimate over a token's (a few tokens' worth: seconds, not minutes)."""
    from mha_trace.models.guards import seconds

    return max(1, round(seconds(model, T) / step_seconds(model, sum(decoded(s) for s in todo))))


def lab_work(model, T: int, todo: list) -> int:
    """The lab's work in decoded tokens: each masked pass's share, and the text's T tokens
    where anything decodes."""
    rows = sum(decoded(s) for s in todo)
    return (len(todo) - rows) * pass_work(model, T, todo) + (T if rows else 0)


def bundled_text(model=None) -> tuple[str, str]:
    """(its name, the text): the bundled corpus's sentences in file order, joined by spaces; for
    a trained run, its first probe sequence (random tokens, the second half repeating the first)."""
    from mha_trace.models import corpus

    if model is not None and model.capabilities.trained_run:
        return "the run's probe sequence", model.default_text
    c = corpus.bundled()
    return c.name, " ".join(c.sentences)


def cache_lab(model, text_name: str, text: str, tokens: int, policies: list, budgets: list,
              sinks: int = 4, renumber: bool = False, progress=None) -> CacheLab:
    """The lab, as `cache` and `model(...).cache(...)` run it: settings checked and the time
    estimated before anything runs; `progress(total)` gives the `advance` of a progress bar."""
    if not model.capabilities.decodes:
        raise MhaError(f"the KV-cache lab needs a model that decodes with a KV cache: smollm2 or a "
                       f"run saved by mha-trace train ({model.name} is an encoder)", quantity="model")
    if renumber and not model.capabilities.rope:
        raise MhaError(f"numbers RoPE positions inside the cache, and {model.name} adds "
                       f"learned positions at its input instead", quantity="renumber")
    check_settings(policies, budgets, sinks)
    ids = text_ids(model, text, tokens)
    if len(ids) < 2:
        raise MhaError(f"{text_name} has no tokens to read", quantity="text")
    todo = settings(policies, budgets, sinks, renumber)
    check_lab_time(model, len(ids), todo)
    from mha_trace.models.guards import check_memory

    T = len(ids)  # a masked pass keeps every layer's weights, twice
    check_memory(model, T, 2 * model.layers * model.heads * T * T * 4, "tokens", "fewer --tokens")
    if progress is None:
        return run_lab(model, text_name, ids, todo)
    with progress(lab_work(model, len(ids), todo)) as advance:
        return run_lab(model, text_name, ids, todo, advance)
