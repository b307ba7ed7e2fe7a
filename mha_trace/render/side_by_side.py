"""Tables side by side where the width allows: weight tables of heads or head counts, each row
as many as fit, or weight tables shrinking (fewer decimals, shorter labels) to share one row."""

from rich.table import Table
from rich.text import Text

GAP = 3  # columns between tables side by side


class SideBySide:
    """Tables in rows, as many to a row as the width holds at their own size (or, with `shrink`,
    weight tables fitted to share one row), a blank line between rows. `renderables` lets the
    HTML and Markdown writers take them one by one."""

    def __init__(self, tables: list, shrink: bool = False):
        self.renderables, self.shrink = tables, shrink

    def __rich_console__(self, console, options):
        from rich.console import Group
        from rich.measure import Measurement

        from mha_trace.io.output import titled_parts

        if self.shrink:  # weight tables give up decimals and labels to share one row
            for table in self.renderables:
                table.fit = (options.max_width - GAP * (len(self.renderables) - 1)) // len(
                    self.renderables)

        # a table's title above it as a line of its own, so that it is not wrapped to the table
        shown = [Group(*titled_parts(t)) if isinstance(t, Table) else t for t in self.renderables]
        widths = [Measurement.get(console, options, t).maximum for t in shown]
        rows, used = [[]], 0
        for table, width in zip(shown, widths):
            if rows[-1] and used + GAP + width > options.max_width:
                rows.append([])
                used = 0
            used += width + (GAP if rows[-1] else 0)
            rows[-1].append((table, width))
        for i, row in enumerate(rows):
            if i:
                yield Text("")
            grid = Table.grid(padding=(0, GAP, 0, 0))
            for _, width in row:
                grid.add_column(width=width)
            grid.add_row(*(table for table, _ in row))
            yield grid


def side_by_side(tables: list, shrink: bool = False):
    """Several tables side by side where the width allows (weight tables shrinking to share one
    row when `shrink`); one table stays itself."""
    return tables[0] if len(tables) == 1 else SideBySide(tables, shrink)
