"""The live explorer's state and the records it shows, without Textual.

A Session is one source of a run (a config, flags, or a pretrained model's sentence) plus what the
lecturer has picked: the head count, the mask, a head, a token, the heads switched off, a layer.
Every view it hands out is the record the CLI prints (ShapesReport, Heads, Walk, Ablation),
computed by the same functions, and cached until a choice that changes it.
"""

from dataclasses import dataclass, field, replace

from mha_trace.core.head import Head
from mha_trace.runs.config import Config
from mha_trace.errors import MhaError
from mha_trace.core.masks import KINDS as MASKS  # the mask cycle: none, causal, window
from mha_trace.core.validate import divisors

PANES = ("trace", "heads", "token", "split", "ablate")
MAX_TOKENS = 64  # every pane shows every token; past this a table stops being readable or quick


def flags_config(d_model: int, heads: int, seq: int, seed: int = 0) -> Config:
    """A generated config for a run given by sizes: tokens t1..tT, weights drawn from the seed."""
    tokens = tuple(f"t{i + 1}" for i in range(seq))
    return Config("flags", "", f"d_model {d_model}, {seq} tokens t1..t{seq}", "", tokens,
                  heads, d_model, seed=seed)


@dataclass
class Session:
    config: Config | None = None  # a config (or flags): every choice applies
    sentence: object = None  # a pretrained model's Sentence: sizes, weights and mask are fixed
    batch: int = 1  # the trace's batch (flags give 2, as `shapes` does)
    layer: int = 1
    head: int = 1  # 1-based, as the chapter numbers heads
    position: int = 0  # the token walked through
    off: frozenset = frozenset()  # heads switched off (ablation), 1-based
    _cache: dict = field(default_factory=dict, repr=False)

    # what the source is and allows
    @property
    def model(self):
        return None if self.sentence is None else self.sentence.model

    @property
    def tokens(self) -> tuple:
        return self.sentence.labels if self.model else self.config.tokens

    @property
    def heads(self) -> int:
        return self.model.heads if self.model else self.config.heads

    @property
    def d_model(self) -> int:
        return self.model.d_model if self.model else self.config.d_model

    @property
    def mask(self) -> str:
        if self.model:
            return "causal" if self.model.capabilities.causal else "none"
        return "window" if self.config.window else self.config.mask

    @property
    def window(self) -> int:
        """The window the mask cycle uses: about half the sentence, at least 2 keys."""
        return max(2, len(self.tokens) // 2)

    def head_counts(self) -> list[int]:
        """The head counts the same Q, K, V can be split into (a model's are fixed)."""
        return [self.heads] if self.model else divisors(self.config.d_model)

    def status(self) -> str:
        """One line of what is picked (the source is in the title above it)."""
        layer = f"layer {self.layer}/{self.model.layers}  " if self.model else ""
        window = not self.model and self.config.window
        mask = f"window {self.config.window}" if window else self.mask
        off = f"  off: {', '.join(map(str, sorted(self.off)))}" if self.off else ""
        return (f"{layer}H={self.heads}  d_k={self.d_model // self.heads}  mask={mask}  │  "
                f"head {self.head}  │  token '{self.tokens[self.position]}'{off}")

    # choices
    def _changed(self, **changes) -> None:
        for name, value in changes.items():
            setattr(self, name, value)
        self._cache.clear()

    def _resplittable(self) -> None:
        if self.model:
            raise MhaError(f"{self.model.name}'s {self.heads} heads per layer are trained; "
                           "only a config or flags can be re-split")

    def set_heads(self, heads: int) -> None:
        """Re-split the same Q, K, V into `heads` heads; the picked head and ablation reset."""
        self._resplittable()
        if heads not in self.head_counts():
            raise MhaError(f"{heads} heads do not divide d_model={self.d_model}", quantity="heads")
        base = self.config
        if base.kv_heads and heads % base.kv_heads:
            base = replace(base, kv_heads=None)
        self._changed(config=base.with_overrides(heads=heads), head=min(self.head, heads),
                      off=frozenset())

    def step_heads(self, direction: int) -> None:
        """The next head count up (1) or down (-1); none past either end."""
        self._resplittable()
        counts = self.head_counts()
        i = counts.index(self.heads) + direction
        if 0 <= i < len(counts):
            self.set_heads(counts[i])

    def set_mask(self, mask: str) -> None:
        if self.model:
            raise MhaError(f"{self.model.name} was trained with "
                           f"{'a causal mask' if self.model.capabilities.causal else 'no mask'}; "
                           "only a config or flags take another")
        if mask not in MASKS:
            raise MhaError(f"mask '{mask}' is not one of {', '.join(MASKS)}", quantity="mask")
        window = self.window if mask == "window" else None
        self._changed(config=replace(self.config, mask="causal" if window else mask,
                                     window=window))

    def cycle_mask(self) -> None:
        self.set_mask(MASKS[(MASKS.index(self.mask) + 1) % len(MASKS)])

    def set_head(self, head: int) -> None:
        self.head = min(max(head, 1), self.heads)

    def set_position(self, position: int) -> None:
        self.position = min(max(position, 0), len(self.tokens) - 1)
        self._cache.pop("walk", None)

    def set_layer(self, layer: int) -> None:
        if not self.model:
            raise MhaError("layers belong to a pretrained model (explore --model minilm)")
        self._changed(layer=min(max(layer, 1), self.model.layers), off=frozenset())

    def set_snapshot(self, direction: int) -> None:
        """A run of `mha-trace train`: the same sentence through its previous or next saved step."""
        if not (self.model and self.model.capabilities.trained_run):
            raise MhaError("snapshots belong to a trained run (explore --checkpoint run.pt)")
        from mha_trace.runs.resolve import RunOptions, load

        steps = self.model.saved_steps
        i = min(max(steps.index(self.model.step) + direction, 0), len(steps) - 1)
        if steps[i] != self.model.step:
            model = load(RunOptions(model=f"{self.model.path}@{steps[i]}"))
            self._changed(sentence=model.encode(self.sentence.text))

    def toggle(self, head: int) -> None:
        """Switch a head off (its slice of the concatenation zeroed before W_O), or back on."""
        self.off = self.off ^ {head}
        self._cache.pop("ablation", None)

    def all_on(self) -> None:
        self.off = frozenset()

    # the records
    def _cached(self, key: str, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def options(self):
        """The run these choices describe, as the resolver takes it."""
        from mha_trace.runs.resolve import RunOptions

        if self.model:
            return RunOptions(model=self.model.key, sentence=self.sentence.text, layer=self.layer)
        return RunOptions(config=self.config)

    def run(self):
        from mha_trace.runs.resolve import resolve

        return resolve(self.options())

    def report(self):
        """The forward pass, traced (ShapesReport): flags trace at their batch, like `shapes`."""
        def make():
            from mha_trace.runs.resolve import RunOptions
            from mha_trace.views.shapes import ShapesRequest, shapes_view

            o = self.options()
            if self.config is not None and self.config.name == "flags":
                c = self.config
                o = RunOptions(batch=self.batch, seq=len(c.tokens), d_model=c.d_model,
                               heads=c.heads, kv_heads=c.kv_heads, mask=c.mask, seed=c.seed,
                               window=c.window)
            return shapes_view(ShapesRequest(o))

        return self._cached("report", make)

    def view(self):
        """Every head's weights of the run (LectureHeads), as `explain` walks them."""
        return self._cached("view", lambda: self.walk().view)

    def walk(self):
        """The picked token through every head (Walk), as `explain` shows it."""
        from mha_trace.views.explain import ExplainRequest, explain_view

        return self._cached("walk", lambda: explain_view(ExplainRequest(self.options(),
                                                                        position=self.position)))

    def ablation(self):
        """The output with the switched-off heads removed (an Ablation, of a config or of a model), or None."""
        if not self.off:
            return None

        def make():
            from mha_trace.views.ablate import AblateRequest, ablate_view

            removed = [Head(self.layer, h).name if self.model else h for h in sorted(self.off)]
            return ablate_view(AblateRequest(self.options(), removed))

        return self._cached("ablation", make)


def prepare(config=None, model=None, sentence=None, layer=None, d_model=None, heads=None,
            seq=None, mask=None, pane="trace"):
    """Check the explorer's options without torch (so a mistake is one line before any screen),
    and return the function that opens the session (it imports torch; the explorer runs it
    off the screen's thread)."""
    if pane not in PANES:
        raise MhaError(f"pane '{pane}' is not one of {', '.join(PANES)}", quantity="pane")
    if mask is not None and mask not in MASKS:
        raise MhaError(f"mask '{mask}' is not one of {', '.join(MASKS)}", quantity="mask")
    from mha_trace.runs.model_options import needs_model, refuse_with_model

    if model:
        from mha_trace.models.guards import check_name

        refuse_with_model(config=config, d_model=d_model, heads=heads, seq=seq, mask=mask)
        check_name(model)
        return lambda: open_model(model, sentence, layer)
    needs_model(sentence, layer)
    if config is not None and (d_model is not None or seq is not None):
        raise MhaError("--config fixes the sizes; --d-model and --seq describe a run without one")
    if d_model is not None or seq is not None:
        from mha_trace.core.validate import check_sizes

        seq, d_model, heads = seq or 10, d_model or 512, heads or 8
        check_sizes(2, seq, d_model, heads)
        if seq > MAX_TOKENS or d_model > 4096:
            raise MhaError(f"explore runs every view live: at most {MAX_TOKENS} tokens and d_model "
                           f"4096 (given {seq} and {d_model}; shapes --device meta takes any size)",
                           quantity="seq" if seq > MAX_TOKENS else "d_model")
        base = flags_config(d_model, heads, seq)
        batch = 2
    else:
        from mha_trace.runs.config import load_config

        base = load_config(config)
        base = base if heads is None else base.with_overrides(heads=heads)
        batch = 1
        if len(base.tokens) > MAX_TOKENS:
            raise MhaError(f"explore shows every token live: at most {MAX_TOKENS} (this config has "
                           f"{len(base.tokens)}; heads --config shows longer ones)",
                           quantity="config")

    def open_config() -> Session:
        s = Session(config=base, batch=batch)
        if mask:
            s.set_mask(mask)
        return s

    if mask:
        open_config()  # a window too wide for the sentence, ...: refused before any screen
    return open_config


def open_model(model: str, sentence: str | None, layer: int | None) -> Session:
    from mha_trace.runs.model_options import check_layer
    from mha_trace.runs.resolve import RunOptions, encode

    s = Session(sentence=encode(RunOptions(model=model, sentence=sentence)))
    if len(s.tokens) > MAX_TOKENS:
        raise MhaError(f"explore shows every token live: at most {MAX_TOKENS} (this sentence has "
                       f"{len(s.tokens)}; heads --model {model} shows longer ones)",
                       quantity="sentence")
    if layer is not None:
        s.set_layer(check_layer(s.model, layer))
    return s


def open_session(**options) -> Session:
    """The explorer's session, opened at once (tests and the Python API)."""
    return prepare(**options)()
