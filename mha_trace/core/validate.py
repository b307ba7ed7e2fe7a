"""Checks on sizes, done once, up front, naming the quantities (no bare asserts, no flag names).

Every source of a run goes through `check_sizes`: flags, configs (which add the file and line to
the message) and `cost`. The CLI adds the flag's name where the error carries one.
"""

from mha_trace.core.clashes import judge, needs
from mha_trace.errors import MhaError


def divisors(n: int) -> list[int]:
    """All divisors of n in O(√n): 12 -> [1, 2, 3, 4, 6, 12]."""
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i != n // i:
                large.append(n // i)
        i += 1
    return small + large[::-1]


MAX_SIZE = 2**31 - 1  # any one size: batch, seq, d_model, heads, layers (GPT-3 uses 12,288)
MAX_SEED = 2**64 - 1  # torch.manual_seed takes 64 bits
MAX_BYTES = 2**62  # one tensor: torch's storage sizes are signed 64-bit byte counts


def valid_counts(n: int, wanted: int) -> str:
    """The divisors of n as a hint: all of them, or the 12 closest to what was asked for."""
    found = divisors(n)
    if len(found) <= 12:
        return ", ".join(map(str, found))
    near = sorted(sorted(found, key=lambda d: (abs(d - wanted), d))[:12])
    return ", ".join(map(str, near)) + f" (12 of the {len(found)} that divide {n:,})"


def positive(name: str, value: int) -> int:
    if value < 1:
        raise MhaError(f"{name}={value} must be a positive integer (at least 1)", quantity=name)
    if value > MAX_SIZE:
        raise MhaError(f"{name}={_short(value)} is too large (at most {MAX_SIZE:,})", quantity=name)
    return value


def seed_fits(seed: int) -> None:
    if not 0 <= seed <= MAX_SEED:
        raise MhaError(f"seed={_short(seed)} must be from 0 to 2**64 - 1", quantity="seed")


def addressable(batch: int, heads: int, seq: int, itemsize: int) -> None:
    """The largest tensor of a run, the (B, H, T, T) scores, must fit torch's storage sizes."""
    size = batch * heads * seq * seq * itemsize
    if size > MAX_BYTES:
        raise MhaError(f"the scores would be a [{batch}, {heads}, {seq}, {seq}] tensor of "
                       f"{size:.2e} bytes, more than torch can address even on the meta device "
                       f"(at most 2**62 bytes); the cost command counts such sizes", quantity="seq")


def _short(value: int) -> str:
    text = str(value)
    return text if len(text) <= 24 else f"{text[:10]}…({len(text)} digits)"


def heads_divide(d_model: int, heads: int) -> None:
    positive("d_model", d_model)
    positive("heads", heads)
    if d_model % heads:
        valid = valid_counts(d_model, heads)
        raise MhaError(f"d_model={d_model} is not divisible by heads={heads} "
                       f"(valid head counts: {valid})", quantity="heads")


def kv_heads_divide(heads: int, kv_heads: int) -> None:
    positive("kv_heads", kv_heads)
    if heads % kv_heads:
        valid = valid_counts(heads, kv_heads)
        raise MhaError(f"heads={heads} is not divisible by kv_heads={kv_heads} "
                       f"(valid kv-head counts: {valid})", quantity="kv_heads")


def rope_pairs(d_model: int, heads: int, dims: int | None = None) -> None:
    """RoPE turns pairs of a head's dims: d_k must be even (said before a run or training); with
    partial RoPE only the first `dims` turn (their evenness is checked with the flag), at most d_k."""
    if dims is not None:
        if heads:
            rope_part(dims, d_model // heads)
        return
    if heads and (d_model // heads) % 2:
        even = [h for h in divisors(d_model) if (d_model // h) % 2 == 0]
        hint = f" (try --heads {', '.join(map(str, even[:4]))})" if even else " (an odd d_model has none)"
        raise MhaError(f"rope turns pairs of dims, so d_k = d_model / heads = {d_model // heads} "
                       f"must be even{hint}", quantity="rope")


def rope_part(dims: int, d_k: int) -> None:
    """Partial RoPE turns the first `dims` of each head's d_k (their evenness is checked with the flag)."""
    if not 2 <= dims <= d_k:
        raise MhaError(f"rope_dim={dims} turns the first dims of each head, so it must be from 2 to d_k = {d_k}",
                       quantity="rope_dim")


def pad_fits(pad: int, seq: int) -> None:
    if not 0 <= pad < seq:
        raise MhaError(f"pad={pad} must be at least 0 and less than seq={seq} "
                       f"(every query needs one key it may look at)", quantity="pad")


def check_sizes(batch: int, seq: int, d_model: int, heads: int | None, kv_heads: int | None = None,
                pad: int = 0) -> None:
    """Every rule on a run's sizes; heads=None skips the head rules (a user's own constructor)."""
    positive("batch", batch)
    positive("seq", seq)
    positive("d_model", d_model)
    if heads is not None:
        heads_divide(d_model, heads)
        if kv_heads is not None:
            kv_heads_divide(heads, kv_heads)
    pad_fits(pad, seq)


TILES = tuple(needs(name, "impl=tiled", "sets the tiles of the tiled pass") for name in ("block_q", "block_k"))
MAX_TILES = 1024  # query tile × key tile steps a tiled trace walks


def check_tiles(impl: str | None, seq: int, block_q: int | None, block_k: int | None) -> None:
    """Tile sizes go with the tiled path, are positive, and cut `seq` into at most MAX_TILES."""
    judge({"impl=tiled": impl == "tiled", "block_q": block_q, "block_k": block_k}, TILES)
    for name, value in (("block_q", block_q), ("block_k", block_k)):
        if value is not None:
            positive(name, value)
    tiles = -(-seq // (block_q or -(-seq // 2))) * -(-seq // (block_k or -(-seq // 2)))
    if impl == "tiled" and tiles > MAX_TILES:
        raise MhaError(f"block_q={block_q} and block_k={block_k} cut seq={seq} into {tiles:,} "
                       f"tiles; a trace walks at most {MAX_TILES:,} (larger blocks)",
                       quantity="block_q" if block_q else "block_k")
