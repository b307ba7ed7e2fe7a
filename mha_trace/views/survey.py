"""The survey view (`mha-trace survey`, `Model.survey`, `Model.composition`, `Model.hear`): which
layer.head of a model does what over a corpus, a file or one text (with a coreference probe, the
effect's share, RoPE's planes), the Q/K/V-composition of a decoder's heads, a causal model's
induction heads, or what Whisper hears and which heads follow the sound. One request; its clashes
declared as data and judged before torch and the model load."""

import os
from dataclasses import dataclass, field

from mha_trace.core.clashes import judge, together, within
from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions

TEXTS = ("sentence", "sentences", "from")
CLASHES = (
    within("audio", ("composition", "induction", "ablate_top", "effect", "rope_planes", "corpus",
                     "grids", *TEXTS),
           "--audio is Whisper's survey of its own: it goes with --alignment and --timestamps, "
           "no sentence, corpus, probe or other survey"),
    within("rope_planes", ("composition", "induction", "ablate_top", "effect", "from"),
           "--rope-planes is a survey of its own: not with --composition, --induction, --effect "
           "or a probe"),
    within("composition", ("induction", "ablate_top", "effect", "corpus", *TEXTS),
           "--composition reads the weights alone: it goes with no sentence, corpus, probe, "
           "--induction or --effect"),
    within("induction", ("sentence", "sentences", "from"), "--induction runs on random tokens "
                                                           "repeated twice, not on a sentence or a probe"),
    within("effect", ("induction",), "--effect goes with the corpus survey, not --induction"),
    together("from", "to", "a coreference probe: e.g. --from it --to animal,street"))


@dataclass(frozen=True)
class SurveyRequest:
    source: RunOptions = field(default_factory=lambda: RunOptions(model="minilm"))
    sentences: str | list | tuple | None = None  # a file, one sentence a line; or the texts
    corpus: bool = False  # the bundled corpus (the default without a sentence or sentences)
    refers: str | None = None  # the coreference probe's word that refers ("it")
    targets: str | list | tuple | None = None  # ... and its candidates ("animal,street")
    effect: bool = False
    rope_planes: bool = False
    composition: bool = False
    induction: bool = False
    ablate_top: int = 0
    alignment: bool = False  # Whisper: its cross-attention heads ranked (what hearing runs)
    timestamps: bool = False
    grids: bool = False  # every behaviour's grid: the renderer's, checked here

    def check(self) -> None:
        """What the options alone decide, before torch."""
        o = self.source
        if (self.alignment or self.timestamps) and o.audio is None:
            raise MhaError("--alignment and --timestamps read what Whisper hears: add --model "
                           "whisper --audio FILE.wav")
        for flag, value, quantity in (("from", self.refers, "source"), ("to", self.targets, "targets")):
            if value is not None and not self.words(value, quantity):
                raise MhaError(f"--{flag} is empty: name a word, e.g. --from it --to animal,street")
        judge({"audio": o.audio, "composition": self.composition,
               "induction": self.induction or bool(self.ablate_top),
               "ablate_top": self.ablate_top or None, "effect": self.effect, "rope_planes": self.rope_planes,
               "corpus": self.corpus, "grids": self.grids, "sentence": o.sentence,
               "sentences": self.sentences, "from": self.refers, "to": self.targets}, CLASHES)
        if sum(x is not None for x in (o.sentence, self.sentences)) + self.corpus > 1:
            raise MhaError("choose one of --corpus, --sentence and --sentences", quantity="sentences")

    @staticmethod
    def words(value, quantity: str = "targets") -> list[str]:
        from mha_trace.runs.values import names

        return [w.strip().lower() for w in names(value, quantity) if w.strip()]


def survey_view(r: SurveyRequest, bar=None):
    """The Survey, RopeShares, Composition, Induction or Hearing the request asks for;
    `bar(total, what)` the progress bar of a pass over many sentences or layers."""
    from mha_trace.runs.resolve import check_options, load, with_checkpoint
    from mha_trace.views.source import no_bar

    o = with_checkpoint(r.source)
    check_options(o)
    r.check()
    import mha_trace.render.alignment  # noqa: F401 (the renderers of what it returns)
    import mha_trace.render.composition  # noqa: F401
    import mha_trace.render.rope_survey  # noqa: F401
    import mha_trace.render.survey  # noqa: F401
    bar = bar or no_bar
    m = load(o)
    if o.audio is not None:
        from mha_trace.analyses.alignment import hear

        return hear(m, m.heard_file(o.audio), r.timestamps)
    if r.composition:
        from mha_trace.analyses.composition import composition

        with bar(m.layers - 1 if m.capabilities.causal else 0, "every later layer's heads") as advance:
            return composition(m, advance)
    if r.induction or r.ablate_top:
        return _induction(m, r, bar)
    chosen = _corpus(m, r)
    with bar(len(chosen.sentences) if len(chosen.sentences) > 1 else 0,
             "encoding the sentences") as advance:
        if r.rope_planes:
            from mha_trace.analyses.rope_survey import rope_shares

            return rope_shares(m, chosen, advance)
        from mha_trace.analyses.model_analysis import survey

        refers = None if r.refers is None else r.words(r.refers, "source")[0]
        targets = None if r.targets is None else r.words(r.targets)
        return survey(m, chosen, refers, targets, advance, r.effect)


def _corpus(m, r: SurveyRequest):
    """The sentences to score: one text, a file's or a list's, a run's probe, or the bundled."""
    from mha_trace.models import corpus
    from mha_trace.runs.values import sentences_of

    if r.source.sentence is not None:
        return corpus.one(r.source.sentence)
    texts = sentences_of(r.sentences)
    if texts:
        return corpus.Corpus(f"{len(texts)} sentences", texts)
    if isinstance(r.sentences, (str, os.PathLike)):
        return corpus.from_file(os.fspath(r.sentences))
    return m.probe_corpus if m.capabilities.trained_run else corpus.bundled()


def _induction(m, r: SurveyRequest, bar):
    """A causal model's induction heads on random tokens repeated twice (three seeds)."""
    from mha_trace.analyses.induction import induction

    if not m.capabilities.causal:
        raise MhaError(f"it needs a causal model; {m.name} is an encoder (try --model "
                       f"smollm2)", quantity="induction")
    seeds = (0, 1, 2)
    with bar(len(seeds) * (2 if r.ablate_top else 1), "random tokens, repeated") as advance:
        return induction(m, seeds=seeds, ablate_top=r.ablate_top, on_pass=advance)
