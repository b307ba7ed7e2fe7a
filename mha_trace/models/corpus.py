"""The sentences a survey scores: the bundled corpus, or the user's file (one sentence a line).

No torch here.
"""

import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from mha_trace.errors import MhaError, printable
from mha_trace.io.files import read_text

LIMIT_BYTES = 1_000_000  # a sentences file is text a person wrote, not a dump
MAX_SENTENCES = 2000


@dataclass(frozen=True)
class Antecedent:
    """A sentence in which "it" refers to `antecedent`, with `other` the other candidate."""

    sentence: str
    antecedent: str
    other: str
    role: str  # "subject" or "object": where the antecedent stands


@dataclass
class Corpus:
    name: str  # how the output names it
    sentences: list  # every sentence scored, the probes' included
    antecedents: list = field(default_factory=list)  # [Antecedent]


def bundled() -> Corpus:
    """The corpus written for mha-trace: varied sentences and "it" with known antecedents."""
    data = tomllib.loads((Path(__file__).with_name("corpus.toml")).read_text("utf-8"))
    probes = [Antecedent(p["sentence"], p["antecedent"], p["other"], p["role"])
              for p in data["coreference"]]
    texts = list(data["sentences"]) + [p.sentence for p in probes]
    return Corpus(f"the bundled corpus of {len(texts)} sentences", texts, probes)


def from_file(path: str) -> Corpus:
    """One sentence a line; blank lines and lines starting with # are skipped."""
    shown = printable(path)
    text = read_text(Path(path), shown, "a text file with one sentence a line", LIMIT_BYTES,
                     "sentences")
    lines = [line.strip() for line in text.splitlines()]
    sentences = [line for line in lines if line and not line.startswith("#")]
    if not sentences:
        raise MhaError(f"{shown}: has no sentences (one a line; lines starting with # are "
                       f"skipped)", quantity="sentences")
    if len(sentences) > MAX_SENTENCES:
        raise MhaError(f"{shown}: has {len(sentences):,} sentences, at most {MAX_SENTENCES:,} "
                       f"(split the file)", quantity="sentences")
    n = len(sentences)
    return Corpus(f"{n} sentence{'s' if n != 1 else ''} from {shown}", sentences)


def one(sentence: str) -> Corpus:
    return Corpus(f"\"{printable(sentence)}\"", [sentence])
