"""mha-trace: see multi-head attention, one tensor operation at a time."""

__version__ = "0.1.0"
