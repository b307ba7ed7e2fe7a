"""What parsing SmolLM2's GGUF yields (its sizes, each tensor's offset and type, and a `tokenizers`
tokenizer from its vocabulary and merges), kept in the user cache keyed by the file's sha256 and
trusted only when every file and value checks out."""

import hashlib
import json
import math
from pathlib import Path

from mha_trace.errors import MhaError
from mha_trace.models.cache import write_cache_file
from mha_trace.models.quant import DEQUANTISE

CACHE_VERSION = 2


def build_meta(path: Path, folder: Path, reinstall: str) -> tuple:
    """Parse the GGUF (gguf's reader): (meta, tokenizer), kept in `folder` for the next run when
    it can be written (the cache is a speed-up: a read-only home only means parsing again)."""
    import gguf
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # a damaged file: gguf's own message, in one line
        raise MhaError(f"{path} cannot be read as GGUF ({type(e).__name__}: {e}); reinstall it "
                       f"with: {reinstall}", exit_code=1) from None
    field = lambda key: reader.fields[key].contents()
    arch = field("general.architecture")
    sizes = {"layers": field(f"{arch}.block_count"), "heads": field(f"{arch}.attention.head_count"),
             "kv_heads": field(f"{arch}.attention.head_count_kv"),
             "d_model": field(f"{arch}.embedding_length"), "d_ff": field(f"{arch}.feed_forward_length"),
             "context": field(f"{arch}.context_length"), "rope_base": field(f"{arch}.rope.freq_base"),
             "eps": field(f"{arch}.attention.layer_norm_rms_epsilon"),
             "vocab": len(reader.fields["tokenizer.ggml.tokens"].data),
             "add_bos": bool(field("tokenizer.ggml.add_bos_token")),
             "bos": field("tokenizer.ggml.bos_token_id"), "eos": field("tokenizer.ggml.eos_token_id"),
             "pre": field("tokenizer.ggml.pre")}
    tensors = {t.name: {"offset": int(t.data_offset), "type": t.tensor_type.name,
                        "rows": int(t.data.shape[0]), "row_bytes": int(t.data.nbytes // t.data.shape[0])}
               for t in reader.tensors}
    tokens = field("tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges, fuse_unk=False)
    tokenizer = Tokenizer(bpe)
    # llama.cpp's SmolLM rule: every digit is its own piece, then GPT-2's byte-level split
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tokenizer.decoder = decoders.ByteLevel()
    text = tokenizer.to_str()
    meta = {"version": CACHE_VERSION, "sizes": sizes, "tensors": tensors}
    meta["sha256"] = digest(meta, text)
    try:
        write_cache_file(folder / "tokenizer.json", text)
        write_cache_file(folder / "meta.json", json.dumps(meta))
    except OSError:
        pass
    return meta, tokenizer


def digest(meta: dict, tokenizer: str) -> str:
    """The sha256 of the cache's contents (meta.json without this field, and tokenizer.json)."""
    body = json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True)
    return hashlib.sha256((body + "\0" + tokenizer).encode("utf-8")).hexdigest()


def _sizes_ok(s: dict) -> bool:
    counts = ("layers", "heads", "kv_heads", "d_model", "d_ff", "context", "vocab")
    return (all(type(s[k]) is int and s[k] > 0 for k in counts)
            and all(type(s[k]) is int and 0 <= s[k] < s["vocab"] for k in ("bos", "eos"))
            and all(type(s[k]) is float and math.isfinite(s[k]) for k in ("rope_base", "eps"))
            and s["rope_base"] > 1 and s["eps"] > 0 and type(s["add_bos"]) is bool
            and s["heads"] % s["kv_heads"] == 0 and s["d_model"] % s["heads"] == 0)


def read_meta(folder: Path, file_size: int):
    """(meta, tokenizer) from the cache, or None when anything there is missing or damaged:
    every file checked by its sha256 and every value by its type (never `assert`, which -O
    strips)."""
    from tokenizers import Tokenizer

    try:
        meta = json.loads((folder / "meta.json").read_text())
        text = (folder / "tokenizer.json").read_text()
        if not (meta["version"] == CACHE_VERSION and meta["sha256"] == digest(meta, text)
                and _sizes_ok(meta["sizes"]) and _tensors_ok(meta, file_size)):
            return None
        tokenizer = Tokenizer.from_str(text)
        return (meta, tokenizer) if tokenizer.get_vocab_size() == meta["sizes"]["vocab"] else None
    except Exception:  # truncated, corrupt or from another version: rebuilt, never trusted
        return None


def _tensors_ok(meta: dict, file_size: int) -> bool:
    tensors = meta["tensors"]
    names = ["token_embd.weight", "output_norm.weight"] + [
        f"blk.{i}.{part}.weight" for i in range(meta["sizes"]["layers"]) for part in (
            "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate",
            "ffn_up", "ffn_down")]
    return all(name in tensors for name in names) and all(
        all(type(t[k]) is int and t[k] > 0 for k in ("offset", "rows", "row_bytes"))
        and t["type"] in DEQUANTISE and t["offset"] + t["rows"] * t["row_bytes"] <= file_size
        for t in tensors.values())
