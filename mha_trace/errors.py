"""The one exception class for problems a user can fix (or must be told about)."""


class MhaError(Exception):
    """A user-facing error: printed as one `Error: ...` line, never as a traceback.

    exit_code 2 means bad input (flags, configs); 1 means the environment or a failed check.
    quantity names what was wrong ("heads", "pad"); the CLI adds the flag that sets it.
    """

    def __init__(self, message: str, exit_code: int = 2, quantity: str | None = None):
        super().__init__(message)
        self.message = message
        self.exit_code = exit_code
        self.quantity = quantity


_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def printable(text: str) -> str:
    """Text safe for a terminal: control characters (escape sequences, bells, carriage returns)
    and bidirectional overrides are shown escaped (a\\x1b[31m), never sent raw."""
    import unicodedata

    if text.isprintable():
        return text
    return "".join(ch.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(ch) == "Cc" or ch in _BIDI else ch for ch in text)
