"""The cache view (`mha-trace cache`, `Model.cache`): the KV-cache lab, a text read token by token
under each eviction policy and cache budget. One request; its settings checked before torch."""

from dataclasses import dataclass, field

from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions


@dataclass(frozen=True)
class CacheRequest:
    source: RunOptions = field(default_factory=lambda: RunOptions(model="smollm2"))
    policies: str | list | tuple = ("full", "window", "sinks", "h2o")  # or "full,window"
    budgets: str | list | tuple = (64, 128, 256)  # or "64,128"
    sinks: int = 4
    tokens: int = 512
    text: str | None = None  # the text itself (default: the bundled corpus, or a run's probe)
    text_file: str | None = None  # ... or a file that holds it
    renumber: bool = False

    def settings(self) -> tuple[list, list, int, int]:
        """(policies, budgets, sinks, tokens), each checked."""
        from mha_trace.analyses.kvcache import check_settings
        from mha_trace.runs.values import names, whole_numbers

        policies = [p.strip() for p in names(self.policies, "policy") if p.strip()]
        budgets = self.budgets
        if isinstance(budgets, str):
            try:
                budgets = [int(b) for b in budgets.split(",") if b.strip()]
            except ValueError:
                raise MhaError("takes a comma-separated list, e.g. --budget 64,128,256",
                               quantity="budget") from None
        budgets = whole_numbers(budgets, "budget", 2)
        for what, values in (("policy", policies), ("budget", budgets)):
            if not values or len(set(values)) != len(values):
                raise MhaError("needs one or more different values, comma-separated", quantity=what)
        sinks = whole_numbers([self.sinks], "sinks")[0]
        check_settings(policies, budgets, sinks)
        if self.text is not None and self.text_file is not None:
            raise MhaError("give the text or its file, not both", quantity="text")
        return policies, budgets, sinks, whole_numbers([self.tokens], "tokens", 2)[0]


def cache_view(r: CacheRequest, bar=None):
    """The CacheLab; `bar(total, what)` the progress bar of the reading."""
    from dataclasses import replace

    from mha_trace.analyses.kvcache import bundled_text, cache_lab
    from mha_trace.runs.resolve import check_options, load, with_checkpoint
    from mha_trace.runs.values import text_of
    from mha_trace.views.source import no_bar

    o = with_checkpoint(r.source)
    check_options(o)
    policies, budgets, sinks, tokens = r.settings()
    import mha_trace.render.kvcache  # noqa: F401 (the renderers of what it returns)
    loaded = load(replace(o, model=o.model or "smollm2"))
    name, words = (_file(r.text_file) if r.text_file is not None else
                   ("the text given", text_of(r.text)) if r.text is not None else bundled_text(loaded))
    bar = bar or no_bar
    try:
        return cache_lab(loaded, name, words, tokens, policies, budgets, sinks, bool(r.renumber),
                         lambda total: bar(total, "reading the text under each cache"))
    except MhaError as e:  # the text came from the request, not from a --sentence
        if e.quantity != "sentence" or (r.text_file is None and r.text is None):
            raise
        raise MhaError(e.message, e.exit_code, "text") from None


def _file(path: str) -> tuple[str, str]:
    """(its name as shown, its text): a text file, read once."""
    from pathlib import Path

    from mha_trace.errors import printable
    from mha_trace.io.files import read_text
    from mha_trace.models.corpus import LIMIT_BYTES

    if not path.strip():
        raise MhaError("give a text file, e.g. --text essay.txt", quantity="text")
    text = read_text(Path(path), printable(path), "a text file", LIMIT_BYTES, "text")
    if not text.strip():
        raise MhaError(f"{printable(path)} holds no words: nothing to read", quantity="text")
    return printable(path), text
