"""Checks on sizes, done once, up front, naming the values (no bare asserts)."""

from mha_trace.errors import MhaError


def divisors(n: int) -> list[int]:
    return [i for i in range(1, n + 1) if n % i == 0]


def positive(name: str, value: int) -> int:
    if value < 1:
        raise MhaError(f"{name}={value} must be a positive integer (at least 1)")
    return value


def heads_divide(d_model: int, heads: int) -> None:
    positive("d_model", d_model)
    positive("heads", heads)
    if d_model % heads:
        valid = ", ".join(map(str, divisors(d_model)))
        raise MhaError(f"d_model={d_model} is not divisible by heads={heads} "
                       f"(valid head counts: {valid})")


def kv_heads_divide(heads: int, kv_heads: int) -> None:
    positive("kv_heads", kv_heads)
    if heads % kv_heads:
        valid = ", ".join(map(str, divisors(heads)))
        raise MhaError(f"heads={heads} is not divisible by kv_heads={kv_heads} "
                       f"(valid kv-head counts: {valid})")
