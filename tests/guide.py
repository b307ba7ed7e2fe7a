"""The README and the guide as the tests read them: docs/readme.py (the script that refreshes their
`$ mha-trace ...` blocks), loaded once, and every block as (page, command, body)."""

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("readme", Path(__file__).parent.parent / "docs" / "readme.py")
readme = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(readme)
BLOCKS = [(page.name, cmd, body) for page in readme.PAGES for _, cmd, body in readme.blocks(page.read_text())]
