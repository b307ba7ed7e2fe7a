"""`mha-trace explore`: the live lecture explorer, a Textual app over a Session.

Five panes, switched with 1-5 or Tab: the traced forward pass (row by row, with the module's source
and what each op did), one head's weights (a cell cursor over queries and keys), one token's walk
through a head (explain), every head of the current split (the chapter's head-count explorer), and
ablation (heads switched off, the output's movement). The head count, the mask and the layer are
changed from any pane. The records come from session.Session: the numbers are the CLI's.

Imported only by the explore command: nothing else imports Textual.
"""


from rich.console import Group
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import DataTable, Header, Static, TabbedContent, TabPane

from mha_trace.explorer import panes as panes
from mha_trace.errors import MhaError
from mha_trace.explorer.session import PANES

KEYS = (  # the help screen, and the README's table of keys
    ("1-5, Tab", "panes: trace, heads, token, split, ablate"),
    ("↑ ↓ ← →", "move in the pane (trace rows; a head's query and key)"),
    ("enter", "in heads: walk the query under the cursor (token pane)"),
    ("[  ]", "previous / next head"),
    ("t  T", "next / previous token (the query walked through)"),
    ("+  -", "more / fewer heads: the same Q, K, V re-split (configs)"),
    ("m", "mask: none → causal → window (configs)"),
    ("<  >", "previous / next layer (pretrained models)"),
    (",  .", "previous / next saved step (a run of mha-trace train)"),
    ("space", "switch the picked head off or on (ablation)"),
    ("a", "every head back on"),
    ("d", "dark / light theme"),
    ("?", "this help (Esc closes it)"),
    ("q", "quit (Ctrl-C too)"),
)


KEY_HINT = "1-5 pane  [ ] head  t token  + - heads  m mask  space off  ? help  q quit"
MODEL_KEY_HINT = "1-5 pane  [ ] head  t token  < > layer  space off  ? help  q quit"
TRAINED_KEY_HINT = "1-5 pane  [ ] head  t token  < > layer  , . training step  ? help  q quit"


def help_table():
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for keys, what in KEYS:
        table.add_row(keys, what)
    return Group(Text("mha-trace explore: the keys (the mouse works too)", style="bold"), Text(""),
                 table)


def _plain(cells) -> list:
    """Text, never markup: code like w[h] and tokens like [CLS] are shown as they are."""
    return [Text(c) if isinstance(c, str) else c for c in cells]


def _columns(table: DataTable, labels, rows, space: int = 0) -> None:
    """Columns as wide as their widest cell (and `space` more, a gap between unpadded cells),
    set once: a DataTable that measures its columns as it draws can draw rows it drew first
    narrower than later ones."""
    from rich.cells import cell_len

    text = lambda cell: cell.plain if isinstance(cell, Text) else str(cell)
    for j, label in enumerate(labels):
        table.add_column(Text(label) if isinstance(label, str) else label,  # "[CLS]" is no markup
                         width=space + max(cell_len(text(label)), *(cell_len(text(row[j])) for row in rows)))


class Help(ModalScreen):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "close")]
    DEFAULT_CSS = """
    Help { align: center middle; }
    Help > Static { width: 76; height: auto; max-height: 22; border: round $accent;
                    padding: 0 1; background: $surface; }
    """

    def compose(self) -> ComposeResult:
        yield Static(help_table(), id="help")


class Explorer(App):
    TITLE = "mha-trace explore"
    CSS = """
    #panes { height: 1fr; }
    #status { height: 1; background: $boost; padding: 0 1; }
    #keys { height: 1; background: $panel; color: $text-muted; padding: 0 1; }
    #steps { height: 1fr; }
    #source { height: 5; }
    #detail { height: 3; }
    #matrix { height: 1fr; }
    #cell, #heads-title { height: 2; }
    TabPane { padding: 0; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        # on stage Ctrl-C quits too, as an interruption: exit 130 and one line, like every command
        Binding("ctrl+c", "interrupt", "quit", show=False, priority=True),
        Binding("question_mark", "help", "help"),
        Binding("1", "pane('trace')", "trace", show=False),
        Binding("2", "pane('heads')", "heads", show=False),
        Binding("3", "pane('token')", "token", show=False),
        Binding("4", "pane('split')", "split", show=False),
        Binding("5", "pane('ablate')", "ablate", show=False),
        Binding("left_square_bracket", "head(-1)", "head", show=False),
        Binding("right_square_bracket", "head(1)", "head ±"),
        Binding("t", "token(1)", "token"),
        Binding("T", "token(-1)", "token back", show=False),
        Binding("plus,equals_sign", "split(1)", "heads ±"),
        Binding("minus", "split(-1)", "fewer heads", show=False),
        Binding("m", "mask", "mask"),
        Binding("less_than_sign", "layer(-1)", "layer", show=False),
        Binding("greater_than_sign", "layer(1)", "layer ±", show=False),
        Binding("comma", "snapshot(-1)", "step", show=False),
        Binding("full_stop", "snapshot(1)", "step ±", show=False),
        Binding("space", "toggle", "head off/on", show=False),
        Binding("a", "all_on", "all on", show=False),
        Binding("d", "theme", "theme", show=False),
    ]

    def __init__(self, open_session, theme: str = "dark", pane: str = "trace", debug: bool = False):
        super().__init__()
        self.reraise = debug  # --debug: a bug in a pane re-raises (with its traceback) instead of a notice
        self.open_session = open_session  # () -> Session; runs in a worker (it imports torch)
        self.session = None
        self.failure = None  # an MhaError from opening the session: the CLI prints it
        self.first_pane = pane
        self.stale = set()  # panes whose records changed while they were hidden
        self.step_shown = None  # the trace row whose source and note are shown
        self.cell_shown = None  # the heads pane's cell that the line under it explains
        self.animation_level = "none"  # on a projector a tab appears at once, no slide
        self.theme = "textual-light" if theme == "light" else "textual-dark"

    def compose(self) -> ComposeResult:
        yield Header()
        with TabbedContent(initial=self.first_pane, id="panes"):
            with TabPane("1 trace", id="trace"):
                yield DataTable(id="steps", cursor_type="row", zebra_stripes=True)
                yield Static(id="source")
                yield Static(id="detail")
            with TabPane("2 heads", id="heads"):
                yield Static(id="heads-title")
                yield DataTable(id="matrix", cursor_type="cell", fixed_columns=1)  # row labels stay
                yield Static(id="cell")
            with TabPane("3 token", id="token"):
                yield VerticalScroll(Static(id="walk"))
            with TabPane("4 split", id="split"):
                yield VerticalScroll(Static(id="maps"))
            with TabPane("5 ablate", id="ablate"):
                yield VerticalScroll(Static(id="ablation"))
        yield Static("loading torch and the run…", id="status")
        yield Static(KEY_HINT, id="keys")  # fixed: Footer redraws itself on every focus change

    def on_mount(self) -> None:
        self.load()

    @work(thread=True, exit_on_error=False)
    def load(self) -> None:
        try:
            session = self.open_session()
            session.report(), session.view()  # the first screen's records, off the UI thread
        except Exception as e:  # said on one line by the command, as every command says it
            self.failure = e if isinstance(e, MhaError) or self.reraise else MhaError(
                f"explore could not open the run: {type(e).__name__}: {e}", exit_code=1)
            self.call_from_thread(self.exit, 2)
            return
        self.call_from_thread(self.ready, session)

    def ready(self, session) -> None:
        self.session = session
        self.sub_title = session.model.name if session.model else session.config.title
        if session.model:
            trained = session.model.capabilities.trained_run
            self.query_one("#keys", Static).update(TRAINED_KEY_HINT if trained else MODEL_KEY_HINT)
        self.refresh_all()
        self._focus_pane(self.first_pane)

    # drawing: each pane from the session's records
    def refresh_all(self, keep_row: bool = False) -> None:
        self.redraw(*PANES, keep_row=keep_row)

    def redraw(self, *panes: str, keep_row: bool = True) -> None:
        """Draw the shown pane now and the status line; the hidden ones when they are shown."""
        if self.session is None:
            return
        shown = self.query_one("#panes", TabbedContent).active
        self.stale |= set(panes)
        if shown in self.stale:
            self.stale.discard(shown)
            self._draw(shown, keep_row)
        self.draw_status()

    def _draw(self, pane: str, keep_row: bool = True) -> None:
        {"trace": lambda: self.draw_trace(keep_row), "heads": self.draw_heads,
         "token": self.draw_token, "split": self.draw_split,
         "ablate": self.draw_ablation}[pane]()

    def draw_status(self) -> None:
        self.query_one("#status", Static).update(Text(self.session.status(), no_wrap=True,
                                                      overflow="ellipsis"))

    def draw_trace(self, keep_row: bool = False) -> None:
        from mha_trace.render.shapes import shape_text

        table = self.query_one("#steps", DataTable)
        row = table.cursor_row if keep_row else 0
        table.clear(columns=True)
        rows = [(str(s.index), str(s.line or "in"), s.op, shape_text(s.shape), s.text)
                for s in self.session.report().steps]
        _columns(table, ("#", "ln", "op", "shape", "code"), rows)  # the code last: it may run long
        for cells in rows:
            table.add_row(*_plain(cells))
        table.move_cursor(row=min(row, table.row_count - 1))
        self.draw_step(table.cursor_row)

    def draw_step(self, row: int) -> None:
        steps = self.session.report().steps
        if not 0 <= row < len(steps):
            return
        self.step_shown = row
        source, detail = panes.step(self.session, steps[row], self.theme == "textual-light")
        self.query_one("#source", Static).update(source)
        self.query_one("#detail", Static).update(detail)

    def draw_heads(self) -> None:
        s = self.session
        view = s.view()
        table = self.query_one("#matrix", DataTable)
        row, column = table.cursor_coordinate
        table.clear(columns=True)
        labels, rows, gap = panes.matrix(view, s.head - 1, self.size.width - 2)  # a scrollbar's room
        table.cell_padding = gap
        _columns(table, labels, rows, 1 - gap)
        for cells in rows:
            table.add_row(*_plain(cells))
        table.move_cursor(row=min(row, table.row_count - 1),
                          column=min(max(column, 1), len(view.tokens)))
        self.query_one("#heads-title", Static).update(panes.heads_title(s, view))
        self.draw_cell()

    def draw_cell(self) -> None:
        self.cell_shown = self.query_one("#matrix", DataTable).cursor_coordinate
        i, j = self.cell_shown
        text = panes.cell(self.session, i, j - 1)
        if text is not None:
            self.query_one("#cell", Static).update(Text(text))  # tokens like [CLS] are not markup

    def draw_token(self) -> None:
        self.query_one("#walk", Static).update(panes.walk_pane(self.session))

    def draw_split(self) -> None:
        self.query_one("#maps", Static).update(panes.split(self.session, self.size.width))

    def draw_ablation(self) -> None:
        self.query_one("#ablation", Static).update(panes.ablation(self.session))

    # events and actions
    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "steps" and event.cursor_row != self.step_shown:
            self._do(lambda: None, lambda: self.draw_step(event.cursor_row))

    def on_data_table_cell_highlighted(self, event: DataTable.CellHighlighted) -> None:
        if event.data_table.id == "matrix" and event.coordinate != self.cell_shown:
            self._do(lambda: None, self.draw_cell)

    def on_data_table_cell_selected(self, event: DataTable.CellSelected) -> None:
        if event.data_table.id == "matrix":
            self._do(lambda: self.session.set_position(event.coordinate.row),
                     lambda: (self.redraw("token"), self.action_pane("token")))

    def _do(self, change, redraw=None) -> None:
        """Apply a choice and redraw. A refused choice (a model's fixed split, ...) is a notice;
        so is a bug of ours, on stage (with --debug it ends the app with its traceback)."""
        if self.session is None:
            return
        try:
            change()
            (redraw or (lambda: self.refresh_all(keep_row=True)))()
        except MhaError as e:
            self.notify(e.message, severity="warning", timeout=4)
        except Exception as e:
            if self.reraise:
                raise
            self.notify(f"internal error: {type(e).__name__}: {e} (explore --debug shows the "
                        "traceback)", severity="error", timeout=8)

    def action_pane(self, pane: str) -> None:
        self.query_one("#panes", TabbedContent).active = pane  # TabActivated moves the focus

    def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        if event.pane.id in self.stale:
            self._do(lambda: None, self.redraw)
        self._focus_pane(event.pane.id)

    def _focus_pane(self, pane: str) -> None:
        """The arrows move in the pane on show: its table, or its scrolling text."""
        focus = {"trace": "#steps", "heads": "#matrix"}.get(pane)
        target = self.query_one(focus) if focus else self.query_one(f"#{pane} VerticalScroll")
        target.focus()

    def action_interrupt(self) -> None:
        self.exit(return_code=130)

    def action_help(self) -> None:
        self.push_screen(Help())

    def action_head(self, step: int) -> None:
        self._do(lambda: self.session.set_head(self.session.head + step),
                 lambda: self.redraw("heads", "token", "split", "ablate"))

    def action_token(self, step: int) -> None:
        self._do(lambda: self.session.set_position(self.session.position + step),
                 lambda: self.redraw("token"))

    def action_split(self, step: int) -> None:
        self._do(lambda: self.session.step_heads(step))

    def action_mask(self) -> None:
        self._do(self.session.cycle_mask if self.session else None)

    def action_layer(self, step: int) -> None:
        self._do(lambda: self.session.set_layer(self.session.layer + step))

    def action_snapshot(self, step: int) -> None:
        def redraw():
            self.sub_title = self.session.model.name  # "run.pt at step 395"
            self.refresh_all(keep_row=True)

        self._do(lambda: self.session.set_snapshot(step), redraw)

    def action_toggle(self) -> None:
        self._do(lambda: self.session.toggle(self.session.head),
                 lambda: self.redraw("ablate"))

    def action_all_on(self) -> None:
        self._do(self.session.all_on if self.session else None,
                 lambda: self.redraw("ablate"))

    def action_theme(self) -> None:
        self.theme = "textual-light" if self.theme == "textual-dark" else "textual-dark"
        if self.session:
            self.draw_step(self.query_one("#steps", DataTable).cursor_row)
