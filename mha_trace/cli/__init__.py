"""The command line: parse options, call the library, render, exit. Nothing else lives here.

One file per group of commands; torch is imported inside the commands that need it, so `--help`,
`configs` and `cost` never import it.
"""

from mha_trace.cli import tracing, views, checks, pretrained, explore  # noqa: F401, I001 (registers commands, in this order)
from mha_trace.cli.app import app, main

__all__ = ["app", "main"]
