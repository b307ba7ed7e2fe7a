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

    def __str__(self) -> str:
        """The message as Python shows it (a notebook, a traceback): naming its parameter, as the
        command line's `Error:` line names the option ("window: expected names ...")."""
        q = self.quantity
        named = [f"{name}{mark}" for name in (q, f"--{q.replace('_', '-')}") for mark in " =:,("] if q else []
        if not q or self.message.startswith(tuple(named)) or (  # it names its own already
                self.message.startswith("--") and f"--{q.replace('_', '-')}" in self.message):
            return self.message
        return f"{q}: {self.message}"


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run stands so that files half-made are removed as on Ctrl-C."""


_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def printable(text: str) -> str:
    """Text safe for a terminal: control characters (escape sequences, bells, carriage returns,
    C1), bidirectional overrides and lone surrogates are shown escaped (a\\x1b[31m), never sent
    raw. The one sanitiser for text that came from a user or a model."""
    import unicodedata

    if text.isprintable():
        return text
    return "".join(ch.encode("unicode_escape", "backslashreplace").decode("ascii")
                   if unicodedata.category(ch) in ("Cc", "Cs") or ch in _BIDI else ch
                   for ch in text)


def printable_data(value):
    """Every string in JSON-ready data made `printable` (dict keys too)."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {printable_data(k): printable_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        if all(type(v) is float or type(v) is int for v in value):
            return value  # a row of numbers (most of a model's JSON): nothing to escape
        return [printable_data(v) for v in value]
    return value
