"""A model trained by `mha-trace train`, at one of its saved steps, as every view of a model sees one.

Its layers are the lecture's own MultiHeadAttention, so `heads`, `explain`, `shapes` and `ablate`
work on it unchanged. Its text is token ids written out, "3 14 7 3 14 7"; by default, the probe
sequence the run's snapshots were taken on.
"""

import contextlib
from dataclasses import replace
from pathlib import Path

import torch

from mha_trace.errors import MhaError, printable
from mha_trace.models.base import Capabilities, Limits
from mha_trace.models.sentence import Sentence, encode_all, rows_of


class Trained:
    """A run of mha-trace train at one saved step (models.base.TrainedRun)."""

    capabilities = Capabilities(causal=True, decodes=True, language_model=False, rope=False,
                                text=False, trained_run=True)
    kv_heads = None
    limits = Limits()  # the defaults; models.load_model gives each call its own
    rope_base = None  # learned positions, added at the input (a run trained with --rope: RoPE's)
    toy_rope_base = 10000.0  # the lecture module's default base, which `train --rope` uses

    def __init__(self, path: str, step: int | None):
        from mha_trace.models.checkpoints import read_checkpoint
        from mha_trace.models.training import Toy

        run = read_checkpoint(path)
        saved = [s.step for s in run.snapshots]
        step = saved[-1] if step is None else step
        if step not in saved:
            raise MhaError(f"{printable(path)} has no snapshot at step {step} (saved: "
                           f"{', '.join(map(str, saved))})", quantity="at_step")
        self.spec, self.step, self.saved_steps, self.path = run.spec, step, saved, path
        if run.spec.rope:  # positions turned into q and k, none learned at the input
            self.capabilities = replace(self.capabilities, rope=True)
            self.rope_base = self.toy_rope_base
        self.key = f"{path}@{step}"  # what load_trained() takes back
        self.name = f"{Path(path).name} at step {step}"
        self.layers, self.heads, self.d_model = run.spec.layers, run.spec.heads, run.spec.d_model
        self.max_positions = run.spec.seq
        self.vocab_size = run.spec.vocab
        from mha_trace.models.corpus import Corpus
        from mha_trace.models.training import probe_batch

        probes = [" ".join(map(str, row)) for row in probe_batch(run.spec).tolist()]
        self.default_text = probes[0]
        self.probe_corpus = Corpus(f"the run's {len(probes)} probe sequences", probes)
        self.toy = Toy(run.spec)
        self.toy.load_state_dict(run.snapshots[saved.index(step)].state)
        self.toy.eval().requires_grad_(False)  # gates alone get gradients (ablate --prune)
        self.device = torch.device("cpu")

    def to(self, device) -> "Trained":
        self.toy.to(device)
        self.device = device
        return self

    def resident(self):
        return contextlib.nullcontext(self)

    def pieces(self, text: str) -> tuple:
        words = text.split()
        V, T = self.vocab_size, self.max_positions
        if not words or not all(_small_id(w, V) for w in words):
            raise MhaError(f"this run's text is token ids 0 to {V - 1} with spaces between, e.g. "
                           f"\"{self.default_text[:20].rsplit(' ', 1)[0]}\"", quantity="sentence")
        if len(words) > T:
            raise MhaError(f"the run was trained on {T} tokens a sequence; this one has "
                           f"{len(words)}", quantity="sentence")
        ids = [int(w) for w in words]
        return ids, tuple(map(str, ids)), tuple(range(len(ids)))

    def tokenize(self, text: str) -> list[int]:
        return self.pieces(text)[0]

    def token_text(self, i: int) -> str:
        return str(i)

    def run(self, ids, batch: int = 1, resume=None, grad: bool = False, last: int | None = None,
            mask=None, caches=None):
        """As SmolLM2's: `mask` in place of the causal one; `caches` (one per layer) when decoding,
        `ids` then coming after the tokens they have seen (their positions go on from there)."""
        rows = rows_of(ids)
        with torch.set_grad_enabled(grad):
            if resume is not None:
                first, x = resume
            elif caches is not None:
                start = caches[0].position
                first, x = 1, self.toy.embed(torch.tensor(rows, device=self.device))
                if self.toy.position is not None:  # learned positions (RoPE turns q and k instead)
                    x = x + self.toy.position.weight[start:start + len(rows[0])]
            else:
                first, x = 1, self.toy.embedded(torch.tensor(rows, device=self.device))
            x = x.expand(batch, *x.shape[1:]) if batch > 1 else x
            return self.toy.layers_from(x, first, last, len(rows), mask, caches)

    def encode(self, text: str) -> Sentence:
        return encode_all(self, [text])[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The next-token logits (B, V) of the last position."""
        return self.unembed(hidden[:, -1])

    def unembed(self, vectors: torch.Tensor, ids=None) -> torch.Tensor:
        logits = self.toy.unembed(vectors)  # a vocabulary of 16: every entry costs nothing
        return logits if ids is None else logits[:, list(ids)]

    def attention_module(self, layer: int):
        return self.toy.blocks[layer - 1]

    # the residual stream by source (models.stream, `explain --why`)
    def embedding_parts(self, ids) -> dict:
        T = len(ids)
        token = self.toy.embed(torch.tensor(list(ids), device=self.device))
        if self.toy.position is None:  # RoPE: positions live in q and k, not in the stream
            return {"token": token}
        return {"token": token, "position": self.toy.position.weight[:T]}

    def stream_steps(self, layer: int) -> list:
        return [] if layer == 0 else [self.toy.blocks[layer - 1]]

    def attention_norm_of(self, layer: int):
        return None

    def attention_input(self, inputs: list, layer: int):
        """What layer `layer`'s attention reads: the residual stream entering it."""
        return inputs[layer - 1]


def _small_id(word: str, below: int) -> bool:
    """0-9 digits only (not '²' or '①', which str.isdigit takes), few enough for int(), below."""
    return word.isascii() and word.isdigit() and len(word) <= 12 and int(word) < below


def load_trained(name: str) -> Trained:
    """"run.pt" (its last snapshot) or "run.pt@600" (the snapshot at step 600); a path may hold an
    "@" of its own ("runs/run@best.pt"). Read once a process for each version of the file, as the
    other models are loaded once (a notebook's or the explorer's calls on one run share it)."""
    path, _, step = (name, "", "") if name.endswith(".pt") else name.rpartition("@")
    if step and not _small_id(step, 10 ** 9):
        raise MhaError(f"step '{printable(step)}' is not a whole number", quantity="at_step")
    version = _version(path)
    if version is None:  # not there, or not a file: reading it says so
        return Trained(path, int(step) if step else None)
    key = (path, step, version)
    if key not in _READ:
        while len(_READ) >= 4:
            _READ.pop(next(iter(_READ)))
        _READ[key] = Trained(path, int(step) if step else None)
    return _READ[key]


_READ: dict[tuple, Trained] = {}  # (path, step, the file's version) -> the run, read once a process


def _version(path: str) -> tuple | None:
    """What tells one state of a file from another: a file rewritten or replaced (`train --save`
    writes a new file and renames it) gets a new inode, size or times, and is read again."""
    import os

    try:
        s = os.stat(path)
    except (OSError, ValueError):
        return None
    return (s.st_dev, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns) if os.path.isfile(path) else None
