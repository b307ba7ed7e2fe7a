"""Which keys a query may look at: one place for the masks every part of the tool draws.

    allowed(5, "causal")          (5, 5) bool: True on and below the diagonal
    allowed(5, "none", pad=2)     the last 2 keys are padding, for every query
    allowed(5, window=2)          causal, and at most 2 keys back (Mistral's sliding window)

Kinds: "none", "causal" and "window" (a window implies causal); padding goes with any of them.
The attention module builds its own window band inside forward, as the lecture's code does; the
references in `references.py` build theirs by hand, independently, on purpose.
"""

import numpy as np

KINDS = ("none", "causal", "window")


def allowed(seq: int, kind: str = "none", pad: int = 0, window: int | None = None) -> np.ndarray:
    """(seq, seq) bool, True where query i may look at key j (numpy; no torch needed)."""
    pos = np.arange(seq)
    keep = np.broadcast_to(pos[None, :] < seq - pad, (seq, seq))  # padding: the last `pad` keys
    if kind in ("causal", "window") or window is not None:
        keep = keep & (pos[None, :] <= pos[:, None])  # causal: no looking ahead
    if window is not None:
        keep = keep & (pos[None, :] > pos[:, None] - window)  # at most `window` keys back
    return np.ascontiguousarray(keep)


def is_masked(kind: str = "none", pad: int = 0, window: int | None = None) -> bool:
    return kind != "none" or pad > 0 or window is not None
