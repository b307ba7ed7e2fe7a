"""Bytes in and out: output formats and streams, files written atomically, the page and notebook HTML."""
