"""The live explorer: its session (no Textual), its panes, its Textual app."""
