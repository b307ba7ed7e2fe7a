"""Renderers, one file per command: records in, rich renderables and JSON-ready data out."""
