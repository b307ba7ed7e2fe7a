"""A CTranslate2 model file (`model.bin`, format version 6) read with the standard library and NumPy.

The layout: the format version (uint32), the spec's name (uint16 length, then bytes), its revision
(uint32), the variable count (uint32), then each variable: its name, its rank (uint8), each
dimension (uint32), its type (uint8: 0 float32, 1 int8, 2 int16, 3 int32, 4 float16), its size in
bytes (uint32) and its data; then the aliases (a count, then name and target pairs).
"""

import struct
from pathlib import Path

import numpy as np

from mha_trace.errors import MhaError

TYPES = {0: np.float32, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.float16}


def read_ct2(path: Path) -> dict:
    """Every variable of the file by name (aliases included), as NumPy arrays."""
    data = Path(path).read_bytes()
    at = 0

    def take(fmt):
        nonlocal at
        values = struct.unpack_from(fmt, data, at)
        at += struct.calcsize(fmt)
        return values if len(values) > 1 else values[0]

    def name():
        nonlocal at
        size = take("<H")
        at += size
        return data[at - size:at].rstrip(b"\0").decode()

    try:
        version, _spec, _revision, count = take("<I"), name(), take("<I"), take("<I")
        if version != 6:
            raise ValueError(f"format version {version}, not 6")
        found = {}
        for _ in range(count):
            key, rank = name(), take("<B")
            shape = [take("<I") for _ in range(rank)]
            kind, size = take("<B"), take("<I")
            found[key] = np.frombuffer(data, TYPES[kind], size // np.dtype(TYPES[kind]).itemsize,
                                       at).reshape(shape)
            at += size
        for _ in range(take("<I") if at < len(data) else 0):
            alias, target = name(), name()
            found[alias] = found[target]
    except (struct.error, ValueError, KeyError, UnicodeDecodeError) as e:
        raise MhaError(f"{path} is not a CTranslate2 model this tool reads ({e})", exit_code=1) from None
    return found
