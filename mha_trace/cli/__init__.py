"""The command line: parse options, call the library, render, exit. Nothing else lives here.

One file per group of commands; torch is imported inside the commands that need it, so `--help`,
`configs` and `cost` never import it.
"""

import inspect

from mha_trace.cli import shapes, heads, catalogue, cost, verify, models, cache, train, explore  # noqa: F401, I001 (registers commands, in this order)
from mha_trace.cli.app import app, main


def _examples_kept(doc: str) -> str:
    """Help text with its `Example:` lines one per line: click rewraps a paragraph unless it
    starts with a \\b line."""
    out = []
    for paragraph in doc.split("\n\n"):
        lines = paragraph.split("\n")
        first = next((i for i, line in enumerate(lines) if line.startswith("Example:")), None)
        if first is None:
            out.append(paragraph)
            continue
        if first:
            out.append("\n".join(lines[:first]))
        out.append("\b\n" + "\n".join(lines[first:]))
    return "\n\n".join(out)


for _command in app.registered_commands:
    _command.help = _examples_kept(inspect.getdoc(_command.callback))

__all__ = ["app", "main"]
