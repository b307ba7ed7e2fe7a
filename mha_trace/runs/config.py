"""Config files: TOML read with tomllib, checked once, into a dataclass. No torch, no numpy.

Two forms (see configs/):
  explicit  tokens + [qkv] Q, K, V (rows = tokens): heads are column slices, W_O optional
  generated sentence (or tokens) + d_model + seed: embeddings and W_q, W_k, W_v, W_o drawn
Optional everywhere: title, description, heads, kv_heads, mask = "none" | "causal", pad.
"""

import difflib
import math
import os
import re
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from mha_trace.errors import MhaError, printable
from mha_trace.io.files import read_text
from mha_trace.core.scoring import Scoring
from mha_trace.core.validate import check_sizes, positive, rope_pairs, seed_fits

DEFAULT = "cat-sat-on-mat"
TOP_KEYS = {"title", "description", "tokens", "sentence", "heads", "kv_heads", "d_model", "seed",
            "mask", "pad", "qkv", "W_O", "rope", "rope_base", "window"}
QKV_KEYS = {"Q", "K", "V", "W_O"}


@dataclass(frozen=True)
class Config:
    name: str
    path: str
    title: str
    description: str
    tokens: tuple
    heads: int
    d_model: int
    kv_heads: int | None = None
    mask: str = "none"
    pad: int = 0
    seed: int = 0
    Q: tuple | None = None  # explicit form: rows of floats
    K: tuple | None = None
    V: tuple | None = None
    W_O: tuple | None = None  # output = concat @ W_O
    origin: str = ""  # where the run came from when not a file: "all-MiniLM-L6-v2 layer 4"
    rope: bool = False  # rotary positions on each head's columns of Q and K
    rope_base: float = 10000.0
    window: int | None = None  # sliding window (causal): a query sees at most this many keys
    scoring: Scoring = Scoring()  # QK-norm, soft-capping, sinks: from the flags (core.scoring)
    latent: int | None = None  # MLA (core.latent_attention): d_c, the latent keys and values come up from
    rope_dim: int | None = None  # ... d_R, its decoupled RoPE key (default d_k / 2)
    absorbed: bool = False  # ... W_UK and W_UV folded in, as inference runs it

    @property
    def explicit(self) -> bool:
        return self.Q is not None

    @property
    def d_k(self) -> int:
        return self.d_model // self.heads

    def with_overrides(self, heads=None, kv_heads=None, mask=None, pad=None, rope=None,
                       rope_base=None, window=None, scoring=None, latent=None, rope_dim=None,
                       absorbed=None) -> "Config":
        """The same config with command-line overrides, checked like the file's own values."""
        pick = lambda new, old: old if new is None else new
        new = replace(self, heads=pick(heads, self.heads), kv_heads=pick(kv_heads, self.kv_heads),
                      mask=pick(mask, self.mask), pad=pick(pad, self.pad),
                      rope=pick(rope, self.rope), rope_base=pick(rope_base, self.rope_base),
                      window=pick(window, self.window), scoring=pick(scoring, self.scoring),
                      latent=pick(latent, self.latent), rope_dim=pick(rope_dim, self.rope_dim),
                      absorbed=pick(absorbed, self.absorbed))
        _check_sizes(new, lambda key: f"--{key.replace('_', '-')}")
        return new


def bundled_dir() -> Path:
    """configs/ inside an installed wheel, or beside the package in a source checkout."""
    here = Path(__file__).resolve().parent.parent
    inside = here / "configs"
    return inside if inside.is_dir() else here.parent / "configs"


def bundled_names() -> list[str]:
    return sorted(p.stem for p in bundled_dir().glob("*.toml"))


def config_path(name_or_path: str | None) -> Path:
    """A config's path: a file path, or a bare name (no folder) of a bundled config."""
    if name_or_path is None:
        return bundled_dir() / f"{DEFAULT}.toml"
    path = Path(name_or_path)
    bare = "/" not in name_or_path and os.sep not in name_or_path
    if bare and not path.exists():
        bundled = bundled_dir() / f"{name_or_path.removesuffix('.toml')}.toml"
        if bundled.is_file():
            return bundled
        names = ", ".join(bundled_names())
        raise MhaError(f"{printable(name_or_path)}: no such file, and no bundled config of that "
                       f"name (bundled configs: {names})")
    return path


MAX_CONFIG_BYTES = 10 * 2**20


def load_config(name_or_path: str | None = None) -> Config:
    path = config_path(name_or_path)
    shown = printable(str(name_or_path)) if name_or_path else f"configs/{DEFAULT}.toml (default)"
    text = read_text(path, shown, "a .toml config file", MAX_CONFIG_BYTES)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise MhaError(f"{shown}: TOML syntax error: {e}") from None
    except RecursionError:
        raise MhaError(f"{shown}: nested too deeply to be a config") from None
    return _parse(data, text, shown, path.stem)


def _line(text: str, key: str) -> str:
    """' (line N)' where `key = ...` first appears in the file, else ''."""
    name = key.split(".")[-1].split(" ")[0]
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*{re.escape(name)}\s*=", line) or line.strip() == f"[{name}]":
            return f" (line {n})"
    return ""


class _Reader:
    """Reads one config file's values, each checked, and words every problem with the file, the
    key and its line."""

    def __init__(self, text: str, shown: str):
        self.text, self.shown = text, shown

    def where(self, key: str) -> str:
        return f"{self.shown}: {key}{_line(self.text, key)}"

    def fail(self, key: str, expected: str, found) -> MhaError:
        found = repr(found) if isinstance(found, str) else found
        return MhaError(f"{self.where(key)}: expected {expected}, found {found}")

    def unknown(self, keys: set, allowed: set, prefix: str = ""):
        for key in sorted(keys - allowed):
            close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.5)
            hint = f" (did you mean '{prefix}{close[0]}'?)" if close else \
                f" (known keys: {', '.join(sorted(allowed))})"
            raise MhaError(f"{self.shown}: unknown key '{prefix}{key}'{_line(self.text, key)}{hint}")

    def integer(self, key: str, value, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.fail(key, f"an integer ≥ {minimum}", value)
        return value

    def string(self, key: str, value) -> str:
        if not isinstance(value, str):
            raise self.fail(key, "a string", value)
        return value

    def matrix(self, key: str, value, rows: int, cols: int | None, what: str) -> tuple:
        if not isinstance(value, list) or not all(isinstance(r, list) for r in value):
            raise self.fail(key, "a list of rows (a list of lists of numbers)", type(value).__name__)
        if len(value) != rows:
            raise self.fail(key, f"{rows} rows ({what})", len(value))
        width = cols if cols is not None else len(value[0])
        for i, row in enumerate(value, 1):
            if len(row) != width:
                like = "like Q" if cols is not None and key != "qkv.Q" else "like row 1"
                raise self.fail(f"{key} row {i}", f"{width} numbers {like}", len(row))
            for j, x in enumerate(row, 1):
                if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                    raise self.fail(f"{key} row {i} column {j}", "a finite number", x)
        return tuple(tuple(float(x) for x in row) for row in value)


def _parse(data: dict, text: str, shown: str, name: str) -> Config:
    r = _Reader(text, shown)
    r.unknown(set(data), TOP_KEYS)
    tokens = _tokens(r, data)
    if "heads" not in data:
        raise MhaError(f"{shown}: missing key 'heads': expected an integer, e.g. heads = 2")
    heads = r.integer("heads", data["heads"], 1)
    kv_heads = r.integer("kv_heads", data["kv_heads"], 1) if "kv_heads" in data else None
    options = _options(r, data)
    title = r.string("title", data.get("title", " ".join(tokens)))
    description = r.string("description", data.get("description", ""))
    Q, K, V, d_model, seed = _qkv(r, data, len(tokens)) if "qkv" in data else _generated(r, data)
    W_O = data.get("W_O", data.get("qkv", {}).get("W_O") if isinstance(data.get("qkv"), dict) else None)
    if W_O is not None:
        key = "W_O" if "W_O" in data else "qkv.W_O"
        W_O = r.matrix(key, W_O, d_model, d_model, f"d_model={d_model}, one per concatenated dim")

    tokens, title, description = [printable(t) for t in tokens], printable(title), printable(description)
    config = Config(name, shown, title, description, tuple(tokens), heads, d_model, kv_heads,
                    options["mask"], options["pad"], seed, Q, K, V, W_O, rope=options["rope"],
                    rope_base=options["rope_base"], window=options["window"])
    _check_sizes(config, r.where)
    return config


def _tokens(r: _Reader, data: dict) -> list:
    if "tokens" in data:
        tokens = data["tokens"]
        if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
            raise r.fail("tokens", "a non-empty list of strings", tokens)
        return tokens
    if "sentence" in data:
        tokens = r.string("sentence", data["sentence"]).split()
        if not tokens:
            raise r.fail("sentence", "at least one word", data["sentence"])
        return tokens
    raise MhaError(f"{r.shown}: missing key 'tokens' (or 'sentence'): expected the list of "
                   f"tokens, e.g. tokens = [\"The\", \"cat\"]")


def _options(r: _Reader, data: dict) -> dict:
    """mask, pad, rope, rope_base and window, each with its default."""
    mask = r.string("mask", data.get("mask", "none"))
    if mask not in ("none", "causal"):
        raise r.fail("mask", "'none' or 'causal'", mask)
    pad = r.integer("pad", data.get("pad", 0), 0)
    rope = data.get("rope", False)
    if not isinstance(rope, bool):
        raise r.fail("rope", "true or false", rope)
    rope_base = data.get("rope_base", 10000.0)
    if isinstance(rope_base, bool) or not isinstance(rope_base, (int, float)) or not 1 < rope_base < 1e300:
        raise r.fail("rope_base", "a number more than 1 and below 1e300 (LLaMA uses 10000)",
                     rope_base)
    window = r.integer("window", data["window"], 1) if "window" in data else None
    return {"mask": mask, "pad": pad, "rope": rope, "rope_base": float(rope_base),
            "window": window}


def _qkv(r: _Reader, data: dict, T: int) -> tuple:
    """An explicit config's Q, K, V (T rows each), its width, and seed 0 (nothing is drawn)."""
    qkv = data["qkv"]
    if not isinstance(qkv, dict):
        raise r.fail("qkv", "a table [qkv] with Q, K, V", type(qkv).__name__)
    r.unknown(set(qkv), QKV_KEYS, "qkv.")
    for key in ("Q", "K", "V"):
        if key not in qkv:
            raise MhaError(f"{r.shown}: missing key 'qkv.{key}': expected a {T}-row matrix "
                           f"(one row per token)")
    Q = r.matrix("qkv.Q", qkv["Q"], T, None, "one per token")
    d_model = len(Q[0])
    if d_model == 0:
        raise r.fail("qkv.Q row 1", "at least one number", 0)
    K = r.matrix("qkv.K", qkv["K"], T, d_model, "one per token")
    V = r.matrix("qkv.V", qkv["V"], T, d_model, "one per token")
    for extra in ("d_model", "seed"):
        if extra in data:
            raise MhaError(f"{r.shown}: key '{extra}'{_line(r.text, extra)} does not go with "
                           f"[qkv] (d_model is the width of Q; nothing is drawn at random)")
    return Q, K, V, d_model, 0


def _generated(r: _Reader, data: dict) -> tuple:
    """A generated config: no Q, K, V; its width and the seed everything is drawn from."""
    for key in ("Q", "K", "V"):
        if key in data:
            raise MhaError(f"{r.shown}: key '{key}'{_line(r.text, key)} must be inside a [qkv] "
                           f"table")
    if "d_model" not in data:
        raise MhaError(f"{r.shown}: missing key 'd_model': expected an integer (the embedding "
                       f"width), or give Q, K, V in a [qkv] table")
    return None, None, None, r.integer("d_model", data["d_model"], 1), \
        r.integer("seed", data.get("seed", 0), 0)


def _check_sizes(c: Config, where) -> None:
    """Rules that involve several keys (or a flag that overrides one): validate's, with the key."""
    try:
        check_sizes(1, len(c.tokens), c.d_model, c.heads, c.kv_heads, c.pad)
        seed_fits(c.seed)
        if c.rope and c.rope_dim is not None:
            rope_pairs(c.d_model, c.heads, c.rope_dim)
        elif c.rope and c.d_k % 2:
            raise MhaError(f"rope turns pairs of dims, so d_k = {c.d_k} must be even",
                           quantity="heads")
        if c.window is not None:
            positive("window", c.window)
        if c.latent is not None and c.explicit:
            raise MhaError(f"MLA makes each head's keys and values from a latent of the token's embedding; "
                           f"{c.title!r} gives Q, K and V by hand: use a generated config (e.g. --config "
                           f"chicken-road)", quantity="latent")
    except MhaError as e:
        key = e.quantity if e.quantity in ("heads", "kv_heads", "pad", "seed", "d_model",
                                           "window", "latent", "rope_dim") else "heads"
        raise MhaError(f"{where(key)}: {e.message}") from None
