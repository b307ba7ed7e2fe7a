"""The one unit every size in bytes is shown in, in every medium: binary, one decimal."""


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'; binary units, one decimal."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError  # unreachable
