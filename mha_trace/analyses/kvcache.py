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
attention module with a cache that evicts (`PolicyCache`).
"""

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mha_trace.core.attention import rope
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


class PolicyCache:
    """A KV cache of at most `budget` tokens, the one being read included, for the lecture's
    MultiHeadAttention: `len()` is the new token's position (its slot in the cache when
    renumbering); `append` evicts down to B - 1, adds the token and returns the keys and values
    its query may see; `observe` takes the step's weights (h2o counts what each key received)."""

    def __init__(self, s: Setting, group: int, rope_base: float):
        self.s, self.group, self.base = s, group, rope_base
        self.k = self.v = None  # (1, Hkv, n, d_k): kept keys (rotated at their original
        self.positions = None  # position, or held unrotated when renumbering); (Hkv, n) each's
        self.score = None  # (Hkv, n) attention received so far (h2o)
        self.seen = 0

    def __len__(self):
        if not self.s.renumber or self.k is None:
            return self.seen
        n = self.k.size(2)  # the slot the next token takes, once append has made room
        return n if self.s.budget is None else min(n, self.s.budget - 1)

    def append(self, k, v):
        """This step's key and value (1, Hkv, 1, d_k); every kept one with it, after evicting
        down to B - 1 to make room."""
        self._evict()
        slot = len(self)
        if self.s.renumber:
            k = rope(k, -slot, self.base)  # held unrotated; turned by its slot at each step
        heads = k.size(1)
        position = torch.full((heads, 1), self.seen, dtype=torch.long)
        if self.k is None:
            self.k, self.v, self.positions = k, v, position
            self.score = torch.zeros(heads, 1, dtype=torch.float64)
        else:
            self.k, self.v = torch.cat([self.k, k], 2), torch.cat([self.v, v], 2)
            self.positions = torch.cat([self.positions, position], 1)
            self.score = torch.cat([self.score, torch.zeros(heads, 1, dtype=torch.float64)], 1)
        self.seen += 1
        keys = rope(self.k, 0, self.base) if self.s.renumber else self.k
        return keys, self.v

    def observe(self, weights) -> None:
        """weights (1, H, 1, n): add the attention each K/V head's keys received (h2o)."""
        if self.s.policy == "h2o":
            received = weights[0, :, 0].double().view(-1, self.group, weights.size(-1)).sum(1)
            self.score += received.to(self.score.device)

    def _evict(self) -> None:
        n = 0 if self.k is None else self.k.size(2)
        if self.s.budget is None or n < self.s.budget:
            return
        keep = self._keep(n, self.s.budget - 1)  # (Hkv, B - 1) indices, in order
        on = keep.to(self.k.device)  # the bookkeeping stays on the CPU, the keys where they run
        take = lambda x: torch.gather(x, 2, on[None, :, :, None].expand(-1, -1, -1, x.size(3)))
        self.k, self.v = take(self.k), take(self.v)
        self.positions = torch.gather(self.positions, 1, keep)
        self.score = torch.gather(self.score, 1, keep)

    def _keep(self, n: int, room: int) -> torch.Tensor:
        heads, S = self.k.size(1), self.s.sinks
        every = torch.arange(n).expand(heads, n)
        if self.s.policy == "window":
            return every[:, n - room:]
        if self.s.policy == "sinks":
            return torch.cat([every[:, :S], every[:, n - (room - S):]], 1)
        recent = self.s.budget // 2 - 1  # with the next token, the last B/2
        middle = self.score[:, S:n - recent]
        heavy = middle.topk(room - S - recent, dim=1).indices.sort(1).values + S
        return torch.cat([every[:, :S], heavy, every[:, n - recent:]], 1)


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


def decode(model, ids: list, s: Setting, on_token=lambda: None) -> CacheResult:
    """Token by token through every layer, each layer with its own PolicyCache; a query sees
    every key its cache returns (a (1, 1) mask of True)."""
    start = time.perf_counter()
    caches = [PolicyCache(s, model.heads // (model.kv_heads or model.heads),
                          model.rope_base)
              for _ in range(model.layers)]
    see_all = torch.ones(1, 1, dtype=torch.bool, device=model.device)
    outputs = []
    with torch.no_grad(), model.resident():
        for token in ids:
            out, _, weights = model.run([token], caches=caches, mask=see_all)
            for cache, w in zip(caches, weights):
                cache.observe(w)
            outputs.append(out)
            on_token()
    nll = _nll(model, torch.cat(outputs, 1), ids)
    held = np.zeros(len(ids))
    for c in caches:
        for row in c.positions:
            held[row.cpu().numpy()] += 1.0 / (len(caches) * c.positions.size(0))
    return CacheResult(s, nll, time.perf_counter() - start, held, decoded=True)


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


DECODE_SECONDS = 0.08  # a token through SmolLM2 with a cache, 2 cores (bench/cache.py); a
TRAINED_DECODE_SECONDS = 0.002  # trained run's few small layers
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


def setting_seconds(model, T: int, s) -> float:
    """One setting's estimate on 2 cores: a decode token by token, or one masked pass."""
    from mha_trace.models.guards import seconds

    per_token = DECODE_SECONDS if model.capabilities.text else TRAINED_DECODE_SECONDS
    return T * per_token if decoded(s) else seconds(model, T)


def check_lab_time(model, T: int, todo: list) -> float:
    """The lab's estimate on 2 cores, refused past LIMIT_SECONDS unless --max-seconds raises it."""
    estimate, limit = sum(setting_seconds(model, T, s) for s in todo), model.limits.seconds(LIMIT_SECONDS)
    if estimate > limit:
        raise MhaError(f"cache would run {len(todo)} settings over {T} tokens: about "
                       f"{estimate / 60:.0f} min on 2 cores, and the guard stops at "
                       f"{limit / 60:g} min; fewer --tokens, budgets or policies, or "
                       f"--max-seconds {estimate + 1:.0f} goes on anyway", quantity="tokens")
    return estimate


def run_lab(model, text_name: str, ids: list, todo: list, on_token=lambda: None) -> CacheLab:
    """Every setting over the text: a masked pass where it is exact, else real decoding.
    on_token() is called once a decoded token, and for a masked pass as often as the decoded
    tokens its time is worth (`work`): a progress bar's estimate then holds steady."""
    lab = CacheLab(ModelCard.of(model), text_name, ids, sinks=todo[0].sinks)
    with model.resident():  # every setting reads the weights dequantised once
        for s in todo:
            if decoded(s):
                lab.results.append(decode(model, ids, s, on_token))
            else:
                lab.results.append(masked_pass(model, ids, s))
                for _ in range(work(model, len(ids), s)):
                    on_token()
    return lab


def work(model, T: int, s) -> int:
    """A setting's share of the lab, in decoded tokens: T for a decode, a masked pass's estimate
    over one decoded token's (a few tokens' worth, not T: it takes seconds, not minutes)."""
    if decoded(s):
        return T
    one = DECODE_SECONDS if model.capabilities.text else TRAINED_DECODE_SECONDS
    return max(1, round(setting_seconds(model, T, s) / one))


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
    with progress(sum(work(model, len(ids), s) for s in todo)) as advance:
        return run_lab(model, text_name, ids, todo, advance)
