"""Renderers, one file per command: records in, rich renderables and JSON-ready data out.

Each file registers what it shows for its records with `mha_trace.records` (`renderables`,
`data`) and, for the interactive page, `mha_trace.io.page.page_data`. A new view is one renderer
file, imported where its record is returned (the command, the API).
"""
