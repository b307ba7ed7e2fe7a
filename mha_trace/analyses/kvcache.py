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
exactly token-by-token decoding (tested). What `h2o` keeps depends on the weights its keys got:
`replayed_pass` runs the model a layer at a time, and each layer's cache evictions are replayed
over that layer's weights to choose its mask (`evictions.replay`), which is again exactly
decoding (tested against it). `renumber` (positions counted inside the cache, as StreamingLLM
does) turns the keys anew at every step, so it decodes for real, one token at a time, through the
lecture's attention module with a cache that evicts (`PolicyCache`). Settings that replay or
decode go together, a batch row each, so the weights are read once for all of them.
"""

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from mha_trace.analyses.evictions import (POLICIES, PolicyCache, Setting, kept_positions,
                                          position_mask, replay)
from mha_trace.errors import MhaError
from mha_trace.models.base import Decoder, ModelCard
from mha_trace.records import Shows

@dataclass(frozen=True)
class CacheResult:
    setting: Setting
    nll: float  # mean negative log-likelihood per predicted token, nats
    seconds: float
    held: np.ndarray  # (positions,) share of layer × K/V heads holding each position at the end
    how: str  # "masked" (one pass), "replayed" (a layer at a time, `replayed_pass`), "decoded"
    first_share: float | None = None  # mean weight on position 0 (queries 1.., every head)

    @property
    def decoded(self) -> bool:
        """Token by token (renumbered settings)."""
        return self.how == "decoded"

    @property
    def perplexity(self) -> float:
        return float(np.exp(self.nll))


@dataclass
class CacheLab(Shows):
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
    return CacheResult(s, nll, time.perf_counter() - start, held, "masked", first_share=first)


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
    return [CacheResult(s, nll[r], seconds, _held(caches, r, len(ids)), "decoded")
            for r, s in enumerate(todo)]


def replayed_pass(model, ids: list, todo: list, on_layer=lambda: None) -> list:
    """Every setting at once (a batch row each, none renumbered), a layer at a time: the layer's
    attention over every earlier token, its PolicyCache's evictions replayed over those weights
    (`evictions.replay`: what each query would see when decoding), and the layer again with that
    mask. The same as decoding (tested), with the weights read twice a layer, not once a token."""
    start, T, R = time.perf_counter(), len(ids), len(todo)
    group = model.heads // (model.kv_heads or model.heads)
    causal = torch.ones(T, T, dtype=torch.bool, device=model.device).tril()
    caches = []
    with torch.no_grad(), model.resident():
        x = sum(model.embedding_parts(ids).values()).expand(R, T, -1)  # (R, T, D): layer 1's input
        for layer in range(1, model.layers + 1):
            norm = model.attention_norm_of(layer)
            weights = model.attention_module(layer)(x if norm is None else norm(x), mask=causal)[1]
            clock = torch.zeros((), dtype=torch.long, device=model.device)
            caches.append(PolicyCache(todo, group, model.rope_base, T, clock))
            seen = replay(caches[-1], weights)  # (R, H, T, T)
            x = model.run([ids] * R, resume=(layer, x), last=layer, mask=seen)[0]
            on_layer()
    nll = [_nll(model, x[r:r + 1], ids) for r in range(R)]
    seconds = (time.perf_counter() - start) / R
    return [CacheResult(s, nll[r], seconds, _held(caches, r, T), "replayed")
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
REPLAY_SECONDS = 2e-4  # a token's evictions replayed in one layer (`evictions.replay`), 2 cores
TICK = 0.1  # the progress bar's unit: a tenth of a second of the estimate
LIMIT_SECONDS = 600  # the lab's time guard


def decoded(s: Setting) -> bool:
    """Whether a setting decodes token by token: renumbering turns every key anew at each step."""
    return s.renumber and s.policy != "full"


def replays(s: Setting) -> bool:
    """Whether a setting's mask comes from evictions replayed over the weights: what h2o keeps
    depends on the attention its keys received."""
    return s.policy == "h2o" and not s.renumber


def how(s: Setting) -> str:
    """How the lab runs a setting: "masked", "replayed" or "decoded" (CacheResult.how)."""
    return "decoded" if decoded(s) else "replayed" if replays(s) else "masked"


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


def lab_parts(model, T: int, todo: list) -> tuple[float, float, float]:
    """The lab's estimate on 2 cores, part by part: (a masked pass, the replayed pass of every
    setting that replays, the decoding of every setting that decodes); 0 for a part not run."""
    from mha_trace.models.guards import seconds

    replaying, decoding = sum(map(replays, todo)), sum(map(decoded, todo))
    return (seconds(model, T),  # the replayed pass: the attention and the layer, a layer at a time
            seconds(model, T, replaying + 1) + T * model.layers * REPLAY_SECONDS if replaying else 0.0,
            T * step_seconds(model, decoding) if decoding else 0.0)


def lab_seconds(model, T: int, todo: list) -> float:
    """The lab's estimate on 2 cores: a masked pass for each setting that has one, and the
    replayed and decoded settings, each kind all together."""
    each, replaying, decoding = lab_parts(model, T, todo)
    return sum(how(s) == "masked" for s in todo) * each + replaying + decoding


def check_lab_time(model, T: int, todo: list) -> float:
    """The lab's estimate on 2 cores, refused past LIMIT_SECONDS unless --max-seconds raises it."""
    estimate, limit = lab_seconds(model, T, todo), model.limits.seconds(LIMIT_SECONDS)
    if estimate > limit:
        raise MhaError(f"cache would run {len(todo)} settings over {T} tokens: about "
                       f"{estimate / 60:.0f} min on 2 cores, and the guard stops at "
                       f"{limit / 60:g} min; fewer --tokens, budgets or policies, or "
                       f"--max-seconds {estimate + 1:.0f} goes on anyway", quantity="tokens")
    return estimate


def run_lab(model, text_name: str, ids: list, todo: list, advance=lambda: None) -> CacheLab:
    """Every setting over the text: a masked pass where it is exact, else the replayed pass or
    decoding, every setting of each at once. advance() is called as often as each pass, layer
    and decoded token's estimate is worth (`lab_ticks`): a progress bar's estimate then holds
    steady."""
    from mha_trace.speedups import batch_work

    lab, found = CacheLab(ModelCard.of(model), text_name, ids, sinks=todo[0].sinks), {}
    ticks = [lambda n=n: [advance() for _ in range(n)] for n in lab_ticks(model, len(ids), todo)]
    kinds = {kind: [s for s in todo if how(s) == kind] for kind in ("masked", "replayed", "decoded")}
    with model.resident(), batch_work():  # the weights dequantised once; every core, and the
        # heap for temporaries (a 512-token pass's weights; a batch of caches)
        for s in kinds["masked"]:
            found[s] = masked_pass(model, ids, s)
            ticks[0]()
        for kind, run, tick in (("replayed", replayed_pass, ticks[1]), ("decoded", decode, ticks[2])):
            found |= dict(zip(kinds[kind], run(model, ids, kinds[kind], tick) if kinds[kind] else []))
    lab.results = [found[s] for s in todo]
    return lab


def lab_ticks(model, T: int, todo: list) -> tuple[int, int, int]:
    """The progress bar's ticks for a masked pass, a layer of the replayed pass and a decoded
    token: a tick for each TICK of its estimate, at least one."""
    each, replaying, decoding = lab_parts(model, T, todo)
    return (max(1, round(each / TICK)), max(1, round(replaying / model.layers / TICK)),
            max(1, round(decoding / T / TICK)))


def lab_work(model, T: int, todo: list) -> int:
    """The lab's ticks in all: each masked pass's, each layer's of the replayed pass, each
    decoded token's."""
    each, layer, token = lab_ticks(model, T, todo)
    return (sum(how(s) == "masked" for s in todo) * each + model.layers * layer * any(map(replays, todo))
            + T * token * any(map(decoded, todo)))


def bundled_text(model=None) -> tuple[str, str]:
    """(its name, the text): the bundled corpus's sentences in file order, joined by spaces; for
    a trained run, its first probe sequence (random tokens, the second half repeating the first)."""
    from mha_trace.models import corpus

    if model is not None and model.capabilities.trained_run:
        return "the run's probe sequence", model.default_text
    c = corpus.bundled()
    return c.name, " ".join(c.sentences)


def cache_lab(model: Decoder, text_name: str, text: str, tokens: int, policies: list, budgets: list,
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
