"""Files the tool reads and writes: precise messages for what is not a readable file, outputs
that never overwrite an input or each other, and writes that are atomic (temporary file, rename).

No torch here: `configs` and `cost` use it.
"""

import os
import stat
import tempfile
from pathlib import Path

from mha_trace.errors import MhaError, printable


def regular_file(path: Path, shown: str, expected: str, quantity: str | None = None) -> os.stat_result:
    """The file's stat when it is a regular file; otherwise one precise line (exit 2)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise MhaError(f"{shown}: not found", quantity=quantity) from None
    except OSError as e:
        raise MhaError(f"{shown}: cannot read it ({e.strerror or e})", quantity=quantity) from None
    kinds = [(stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket")]
    for test, kind in kinds:
        if test(st.st_mode):
            raise MhaError(f"{shown}: is {kind}, expected {expected}", quantity=quantity)
    return st


def read_text(path: Path, shown: str, expected: str, limit: int, quantity: str | None = None) -> str:
    """A small UTF-8 text file (a byte-order mark is accepted, as editors write it)."""
    st = regular_file(path, shown, expected, quantity)
    if st.st_size > limit:
        raise MhaError(f"{shown}: has {st.st_size:,} bytes, expected {expected} of at most "
                       f"{limit:,}", quantity=quantity)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise MhaError(f"{shown}: cannot read it ({e.strerror or e})", quantity=quantity) from None
    if b"\0" in data:
        raise MhaError(f"{shown}: is a binary file, expected {expected}", quantity=quantity)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise MhaError(f"{shown}: is not UTF-8 text (byte {e.start}), expected {expected}",
                       quantity=quantity) from None


SUFFIXES = {"svg": (".svg",), "html": (".html", ".htm"), "png": (".png",), "save": (".pt",)}
EXAMPLES = {"svg": "picture.svg", "html": "page.html", "png": "slide.png", "save": "run.pt"}
CHECKPOINT = "mha-trace train"  # the format a checkpoint of `train --save` names inside


def check_outputs(outputs: dict, inputs: list) -> None:
    """--svg/--html/--png/--save paths, checked before anything runs: the right suffix, a folder
    that exists and takes a file, never an input file, never the same file twice, never anything
    but a regular file replaced (a device, a pipe), and --save never over a file that is not a
    checkpoint of ours."""
    seen: dict = {}
    protected = {_identity(p): p for p in inputs if p and os.path.isfile(p)}
    for option, path in outputs.items():
        if path is None:
            continue
        shown = printable(path)
        if not path.strip():
            raise MhaError(f"give a file name, e.g. --{option} {EXAMPLES[option]}",
                           quantity=option)
        if os.path.isdir(path):
            example = printable(os.path.join(path, EXAMPLES[option]))
            raise MhaError(f"{shown} is a directory; give a file name, e.g. {example}",
                           quantity=option)
        if not path.lower().endswith(SUFFIXES[option]):
            raise MhaError(f"{shown} does not end in {' or '.join(SUFFIXES[option])}",
                           quantity=option)
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise MhaError(f"{shown}: the folder {printable(parent)} does not exist",
                           quantity=option)
        _name_fits(path, parent, shown, option)
        replaceable(path, option)
        if option == "save" and os.path.lexists(path) and not _ours(path):
            raise MhaError(f"{shown} exists and is not a checkpoint of mha-trace train; it is "
                           f"never overwritten (give a new name)", quantity=option)
        key = _identity(path)
        if key in protected:
            raise MhaError(f"{shown} is an input of this command ({printable(protected[key])}); "
                           f"it is never overwritten", quantity=option)
        if key in seen:
            raise MhaError(f"{shown} is also the --{seen[key]} file", quantity=option)
        seen[key] = option
        _writable(parent, shown, option)


def _name_fits(path: str, folder: str, shown: str, option: str) -> None:
    """A file name the folder's file system takes (255 bytes on most), checked before running."""
    try:
        longest = os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        longest = 255
    if len(os.fsencode(os.path.basename(path))) > longest:
        raise MhaError(f"{shown}: the file name is longer than the {longest} bytes a name may have "
                       f"here", quantity=option)


def replaceable(path: str, option: str) -> None:
    """Only a regular file (or a link, which is replaced, never written through) may be replaced:
    never a device such as /dev/null, a named pipe or a socket."""
    try:
        st = os.lstat(path)
    except OSError:
        return
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise MhaError(f"{printable(path)} is not a regular file (a device, a pipe or a socket); "
                       f"it is never replaced", quantity=option)


def _ours(path: str) -> bool:
    """A torch.save archive whose pickle names our checkpoint format (read without torch)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            pickled = [n for n in archive.namelist() if n.endswith("/data.pkl")]
            return len(pickled) == 1 and CHECKPOINT.encode() in archive.read(pickled[0])
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def _writable(folder: str, shown: str, option: str) -> None:
    """The folder takes a new file (a read-only disk, a folder of another user's): tried, not guessed."""
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".mha-trace-", suffix=".tmp")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise MhaError(f"cannot write {shown}: {e.strerror or e}", exit_code=1,
                       quantity=option) from None


def _identity(path: str):
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except OSError:
        return os.path.abspath(path)


WRITTEN: list = []  # (path, bytes) of each file written, in order: the command line announces them


def write_atomic(path: str, data: bytes | str, option: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file.
    Each file written is kept in WRITTEN (the command line says so on stderr when it is done)."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    replaceable(path, option)  # checked again as it is written: never a device or a pipe
    folder = os.path.dirname(os.path.abspath(path))
    try:
        fd, temporary = tempfile.mkstemp(dir=folder, prefix=".mha-trace-", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.chmod(temporary, 0o644)
            os.replace(temporary, path)
            WRITTEN.append((path, len(payload)))
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as e:
        raise MhaError(f"cannot write {printable(path)}: {e.strerror or e}", exit_code=1,
                       quantity=option) from None


def written_line(files: list) -> str:
    """`Wrote page.html (153 KB)`, or for a set: `Wrote 31 files (4.2 MB): a.png, ... c.png`."""
    from mha_trace.io.units import human_bytes

    total = human_bytes(sum(n for _, n in files))
    if len(files) == 1:
        return f"Wrote {files[0][0]} ({total})"
    if len(files) <= 3:
        return f"Wrote {', '.join(p for p, _ in files)} ({total})"
    return f"Wrote {len(files)} files ({total}): {files[0][0]}, {files[1][0]} … {files[-1][0]}"
