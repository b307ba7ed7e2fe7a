"""The Python API: the library the CLI calls, for notebooks and scripts.

    import mha_trace
    t = mha_trace.trace(module, x)                    # any module or function, its arguments
    mha_trace.trace_sizes(d_model=512, heads=8)       # like `mha-trace shapes`
    mha_trace.heads("cat-sat-on-mat"); mha_trace.explain("cat-sat-on-mat", token="cat", head=1)
    m = mha_trace.model("minilm")                     # loaded once, offline; also "smollm2"
    m.heads("The animal didn't cross the street because it was too tired."); m.composition()
    m.explain("...", token="it", head="4.2"); m.survey("..."); m.ablate("...", removed=["4.2"])
    mha_trace.verify(MyAttention); mha_trace.cost(preset="gpt3-175b", dtype="float16")

Every result is the record the CLI prints: in Jupyter it shows once, as HTML tables; `print(r)` gives
the terminal text; `r.data()` and `r.to_json()` the JSON of `--format json`. Every run goes through
`resolve`, so bad input raises `MhaError` naming the quantity, as the CLI's `Error:` line does.
"""

import contextlib
import os
from dataclasses import replace

from mha_trace.errors import MhaError
from mha_trace.models.registry import entry, listed
from mha_trace.runs.values import names, text_of
from mha_trace.runs.resolve import RunOptions, check_options, load, resolve


def trace(module, *args, **kwargs):
    """Run `module(*args, **kwargs)` once under the tracer: every tensor op, its shape and memory.
    A NumPy implementation (a class with forward) is traced array op by array op; a function too.

    >>> trace(torch.nn.MultiheadAttention(64, 4, batch_first=True), x, x, x).steps[0].shape
    (2, 10, 64)
    """
    from mha_trace.views.shapes import call_view

    return call_view(module, args, kwargs)


def trace_sizes(*, compact: bool = False, compare_impl: bool = False,
                include_inputs: bool = False, **options):
    """The built-in module at these sizes, traced: like `mha-trace shapes` with the same flags
    (batch, seq, d_model, heads, kv_heads, mask, pad, dtype, device, seed, rope, window, impl,
    block_q, block_k, decode; config=, module=, model= with sentence= and layer=, audio= and
    attention= for another source); compact=True the lecture's eight rows, compare_impl=True the
    explicit path beside impl="sdpa" or "tiled", include_inputs=True the inputs in `.data()`.

    >>> trace_sizes(d_model=512, heads=8, mask="causal").largest.shape
    (2, 8, 10, 10)
    """
    from mha_trace.views.shapes import ShapesRequest, shapes_view

    return shapes_view(ShapesRequest(_options(options), compact, compare_impl, include_inputs))


def heads(config=None, *, head=None, effect: bool = False, overview: bool = False,
          words: bool = False, hide_special: bool = False, include_inputs: bool = False,
          **options):
    """Every head's weights for a config (a bundled name, a TOML path or a Config; default the
    chapter's), re-split with heads=, masked with mask=/pad=/window=, or on your module=; or a
    model's (model="minilm", sentence=..., layer=, head="4.2", words=, hide_special=), or
    Whisper's (model="whisper", audio=FILE, attention="cross" | "self" | "encoder");
    effect=True adds the effect weights (weight × ‖v·W_O‖, renormalised).

    >>> heads("cat-sat-on-mat").weights.shape
    (2, 5, 5)
    """
    from mha_trace.views.heads import HeadsRequest, heads_view

    return heads_view(HeadsRequest(_options(options, config=config), head, overview, words,
                                   hide_special, effect, False, include_inputs))


def explain(config=None, token: str | None = None, position: int | None = None, *,
            head=None, effect: bool = False, why: bool = False, by_head: bool = False,
            impl: str = "explicit", block_k: int | None = None, rope_planes: bool = False,
            include_inputs: bool = False, **options):
    """One token through every head (or just `head`), every product written out; effect=True
    adds each key's ‖v·W_O‖ and effect weight; why=True splits each score into the head's dims;
    impl="tiled" walks the row through FlashAttention-2's loop, `block_k` keys a tile;
    rope_planes=True splits each score by RoPE's rotation planes (with rope=True). `config` as in
    `heads` (or a record `heads` returned: its config again); model=, module=, audio= as there.

    >>> explain("cat-sat-on-mat", token="cat", head=1).heads[0].terms[1].weight
    0.2509...
    """
    from mha_trace.views.explain import ExplainRequest, explain_view

    config = getattr(config, "config", config)  # a LectureHeads: the config it ran
    return explain_view(ExplainRequest(_options(options, config=config), token, position, head,
                                       effect, why, by_head, impl, block_k, rope_planes,
                                       include_inputs))


def ablate(config=None, removed=(2,), **options):
    """The output with the given heads (from 1; a model's "L.H") zeroed before W_O, and how far
    each token moved."""
    from mha_trace.views.ablate import AblateRequest, ablate_view

    return ablate_view(AblateRequest(_options(options, config=config), removed), _notebook_bar)


def compare(config=None, head_counts=(1, 2, 4), **options):
    """The same Q, K, V split into each head count (`mha-trace compare --heads 1,2,4`)."""
    from mha_trace.views.compare import CompareRequest, compare_view

    return compare_view(CompareRequest(_options(options, config=config), head_counts))


def verify(module=None, *, map: str | None = None, mask_means: str = "any", course: str | None = None,
           gradebook: str | None = None, jobs: int | None = None, time_limit: float | None = None,
           memory: float | None = None, **options):
    """The built-in module (or your class, or 'FILE.py:Class') against independent references:
    numpy by hand, nn.MultiheadAttention and F.scaled_dot_product_attention. `.passed` says it.
    course="cs231n" (or a profile's .toml path) checks your class under a course's conventions;
    'class/*.py:Name' (a glob or a folder) verifies a whole class, each submission in a contained
    process of its own (jobs, time_limit in seconds, memory in GiB), into a Gradebook.

    >>> verify(heads=8, kv_heads=2, mask="causal", dtype="float64").passed
    True
    """
    from mha_trace.views.verify import verify_view

    if course is not None and not isinstance(course, str):
        raise MhaError(f"course={course!r} is a course's name or a profile's .toml path", quantity="course")
    o = _options(options, config=options.pop("config", None), module=module)
    return verify_view(o, map, mask_means, course, gradebook, (jobs, time_limit, memory))


def cost(preset: str | None = None, **dims):
    """Parameters, FLOPs, score memory and KV cache, exactly (`mha-trace cost`); no torch.

    >>> cost(preset="gpt3-175b", dtype="float16").data()["totals"]["parameters"] > 0
    True
    """
    from mha_trace.views.cost import cost_view

    return cost_view(preset, **dims)


class Model:
    """A pretrained model, loaded once and offline: every view of `mha-trace ... --model NAME`.
    Text defaults to "The animal didn't cross the street because it was too tired."

    >>> m = model("minilm")
    >>> m.heads(head="1.3")          # one head; layer=4 for a layer; neither for the overview
    """

    def __init__(self, name: str, device: str = "cpu", max_tokens: int | None = None,
                 max_seconds: float | None = None):
        self.name, self.device, self.max_tokens = name, device, max_tokens
        self.max_seconds = max_seconds
        if not entry(name).audio:  # loaded now, so that a bad device is said here (audio: by hear)
            self.model

    @property
    def source(self) -> RunOptions:
        """The options every view of this model starts from."""
        return RunOptions(model=self.name, device=self.device, max_tokens=self.max_tokens,
                          max_seconds=self.max_seconds)

    @property
    def model(self):
        """The loaded model, on this object's device (one copy per process: it moves)."""
        return load(self.source)

    def __repr__(self) -> str:
        if entry(self.name).audio:
            return f"<mha_trace model {self.name}: {entry(self.name).title}, hears audio: .hear(FILE)>"
        m = self.model
        layers = f"{m.layers} layer{'s' if m.layers > 1 else ''}"
        return f"<mha_trace model {self.name}: {m.name}, {layers} × {m.heads} heads>"

    def _on(self, text=None, layer=None, audio=None, attention=None) -> RunOptions:
        o = replace(self.source, sentence=text_of(text), layer=layer, attention=attention,
                    audio=None if audio is None else os.fspath(audio))
        check_options(o)
        return o

    def run(self, text: str | None = None, layer: int | None = None):
        """The Run of one layer (default 1) on the text: what every view reads."""
        return resolve(self._on(text, layer))

    def heads(self, text: str | None = None, *, layer: int | None = None,
              head: str | None = None, words: bool = False, hide_special: bool = False,
              effect: bool = False, overview: bool = False, audio=None,
              attention: str | None = None):
        """Every head (an overview), one layer's (`layer=4`), or one (`head="4.2"`); effect=True
        adds the effect weights. Whisper: audio=FILE, its cross-attention heads (attention=
        "encoder" its encoder's, "self" its decoder's self-attention, every option)."""
        from mha_trace.views.heads import HeadsRequest, heads_view

        return heads_view(HeadsRequest(self._on(text, layer, audio, attention), head, overview,
                                       words, hide_special, effect))

    def explain(self, text: str | None = None, *, token: str | None = None,
                position: int | None = None, head: str | None = None, layer: int | None = None,
                effect: bool = False, why: bool = False, by_head: bool = False,
                impl: str = "explicit", block_k: int | None = None, rope_planes: bool = False,
                audio=None, attention: str | None = None):
        """One token through a layer's heads (`head="6.12"` picks the layer and the head);
        effect=True adds each key's ‖v·W_O‖ and effect weight; why=True splits each score by
        source (by_head=True: each earlier head a source of its own); impl="tiled" walks the
        row through FlashAttention-2's loop, `block_k` keys a tile; rope_planes=True splits
        each score by RoPE's rotation planes. Whisper: audio=FILE, one written token through
        every cross-attention head (attention="encoder": one frame; "self": every option)."""
        from mha_trace.views.explain import ExplainRequest, explain_view

        return explain_view(ExplainRequest(self._on(text, layer, audio, attention), token,
                                           position, head, effect, why, by_head, impl, block_k,
                                           rope_planes))

    def trace(self, text: str | None = None, layer: int = 1, *, audio=None,
              attention: str | None = None):
        """One layer's attention on the text's hidden states (Whisper: on what it heard from
        audio=FILE), traced op by op."""
        from mha_trace.views.shapes import ShapesRequest, shapes_view

        return shapes_view(ShapesRequest(self._on(text, layer, audio, attention)))

    def survey(self, text: str | None = None, *, sentences=None, source: str | None = None,
               targets=None, effect: bool = False, rope_planes: bool = False,
               induction: bool = False, ablate_top: int = 0):
        """Which layer.head does what, over the bundled corpus (default), one text, or
        `sentences`: a list of texts or the path of a file with one a line; effect=True adds
        the sinks' share of the effect beside their share of the weight; source="it" with
        targets=["animal", "street"] a coreference probe; rope_planes=True each head's |q·k| by
        band of RoPE planes; induction=True (a causal model) its induction heads on random
        repeated tokens, ablate_top=K the loss with the K best removed."""
        from mha_trace.views.survey import SurveyRequest, survey_view

        return survey_view(SurveyRequest(self._on(text), sentences, False, source, targets,
                                         effect, rope_planes, False, induction, ablate_top),
                           _notebook_bar)

    def hear(self, audio, *, timestamps: bool = False):
        """What whisper hears in a WAV file, its heads by how well they follow the sound (like
        `survey --model whisper --audio`); timestamps=True adds each word's timing."""
        from mha_trace.views.survey import SurveyRequest, survey_view

        return survey_view(SurveyRequest(self._on(audio=audio), timestamps=timestamps))

    def composition(self):
        """Q-, K- and V-composition of every head with every head of an earlier layer, from the
        weights (a decoder: smollm2 or a trained run), beside random matrices."""
        from mha_trace.views.survey import SurveyRequest, survey_view

        return survey_view(SurveyRequest(self.source, composition=True), _notebook_bar)

    def ablate(self, text: str | None = None, *, removed=(), heads=None):
        """The model's output with the `removed` heads ("4.2", ...) zeroed before W_O, as
        `mha_trace.ablate(removed=...)` names them (`heads=` is the old name, kept this release)."""
        from mha_trace.views.ablate import AblateRequest, ablate_view

        removed = removed if heads is None else heads  # "4.2,5.1" or a list
        if removed in ((), [], None):
            raise MhaError("name at least one head to remove, e.g. removed=['6.12']", quantity="removed")
        names(removed, "removed")  # "4.2,5.1" or a list of them
        return ablate_view(AblateRequest(self._on(text), removed))

    def rank(self, text: str | None = None):
        """Every head removed on its own, ranked by how far the output moves."""
        from mha_trace.views.ablate import AblateRequest, ablate_view

        return ablate_view(AblateRequest(self._on(text), rank=True), _notebook_bar)

    def prune(self):
        """A causal model's heads ranked by importance on the bundled corpus and removed least
        important first, the next-token loss at each step (like `ablate --prune`)."""
        from mha_trace.views.ablate import AblateRequest, ablate_view

        return ablate_view(AblateRequest(self.source, prune=True), _notebook_bar)

    def predict(self, text: str = "The capital of France is", top: int = 10, generate: int = 0):
        """A causal model's next-token distribution (and `generate` greedy tokens)."""
        from mha_trace.views.predict import PredictRequest, predict_view

        return predict_view(PredictRequest(self.source, text, top, generate), _notebook_bar)

    def patch(self, clean: str | None = None, corrupt: str | None = None, *,
              metric: str | None = None, noising: bool = False, sender: str | None = None,
              receiver: str | None = None, by_input: bool = False, by_position: str | None = None):
        """Activation patching (like `mha-trace patch`): each residual entry and head output copied
        clean → corrupted (noising=True: the other way); without texts, an indirect-object sentence
        or a trained run's probe. by_input=True adds queries and K/V groups; by_position="24.1" one
        head a position at a time; sender="1.1" (or "1.1,1.2", a list), receiver="2.4": path patching."""
        from mha_trace.views.patch import PatchRequest, patch_view

        return patch_view(PatchRequest(self.source, clean, corrupt, metric, noising, sender,
                                       receiver, by_input, by_position), _notebook_bar)

    def cache(self, text: str | None = None, *, policies=("full", "window", "sinks", "h2o"),
              budgets=(64, 128, 256), sinks: int = 4, tokens: int = 512, renumber: bool = False,
              text_file=None):
        """The KV-cache lab (like `mha-trace cache`): the text (default: the bundled corpus; or
        the file text_file) read token by token under each eviction policy and cache budget."""
        from mha_trace.views.cache import CacheRequest, cache_view

        path = None if text_file is None else os.fspath(text_file)
        return cache_view(CacheRequest(self.source, policies, budgets, sinks, tokens, text, path,
                                       renumber), _notebook_bar)


@contextlib.contextmanager
def _notebook_bar(total: int, what: str):
    """A view's progress, as a notebook's bar (nothing outside a kernel)."""
    from mha_trace.io.page import NotebookProgress

    bar = NotebookProgress(total, what)
    yield lambda *_: bar.advance()


def model(name: str, device: str = "cpu", max_tokens: int | None = None,
          max_seconds: float | None = None) -> Model:
    """A pretrained model shipped in a PyPI package, loaded offline: "minilm", "smollm2" or
    "whisper" (it hears: `.hear(FILE)`), or a run saved by `train` ("run.pt", "run.pt@600" for a
    saved step), on device "cpu" (default), "cuda" or "mps"; max_tokens raises its token guard
    (MiniLM 512, SmolLM2 256), max_seconds its time guard (ranking heads 30 s, the cache lab 600 s,
    estimated on 2 cores)."""
    if not isinstance(name, (str, os.PathLike)) or isinstance(os.fspath(name), bytes):
        raise MhaError(f"name={name!r} is not a model's name ({listed()}) or a saved run's "
                       f"path such as 'run.pt'", quantity="model")
    name = os.fspath(name)
    entry(name)  # a registered name or a saved run, or one line naming them
    device = "cpu" if device is None else device  # None: the default, as on the command line
    check_options(RunOptions(device=device, max_tokens=max_tokens, max_seconds=max_seconds))
    return Model(name, device, max_tokens, max_seconds)


def train(task: str = "induction", *, resume=None, save: str | None = None, on_step=None,
          **options):
    """Train a tiny attention-only model from scratch (like `mha-trace train`): the run's record,
    with every snapshot. options: layers, heads, d_model, vocab, seq, batch, steps, lr, seed,
    identical_heads, snapshots. `resume` a saved path or a record; `save` a path for the run
    (then `mha_trace.model("run.pt")` is a model every view reads)."""
    from mha_trace.models.spec import Spec
    from mha_trace.models.training import Training
    from mha_trace.views.train import TrainRequest, train_view

    known = set(Spec.__dataclass_fields__) - {"task"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise MhaError(f"train has no option {unknown[0]!r} (it has {', '.join(sorted(known))})",
                       quantity=unknown[0])
    if not (resume is None or isinstance(resume, (str, os.PathLike, Training))):
        raise MhaError(f"resume={resume!r} is not a saved run's path or a run mha_trace.train "
                       f"returned", quantity="resume")
    if not (save is None or isinstance(save, (str, os.PathLike))):
        raise MhaError(f"save={save!r} is not a path such as 'run.pt'", quantity="save")
    given = {k: v for k, v in options.items() if v is not None}
    return train_view(TrainRequest(task, given, resume, None if save is None else os.fspath(save)),
                      _notebook_bar, on_step=on_step or (lambda loss: None))


def _options(options: dict, **source) -> RunOptions:
    """Keyword arguments as RunOptions, an unknown one refused by name."""
    known = set(RunOptions.__dataclass_fields__)
    unknown = sorted(set(options) - known)
    if unknown:
        raise MhaError(f"unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})",
                       quantity=unknown[0])
    o = RunOptions(**{k: v for k, v in source.items() if v is not None}, **options)
    check_options(o)
    return o
