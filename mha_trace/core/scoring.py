"""What the lecture's module does to the scores past q·k/√d_k, in modern models: one value, no torch.

    QK-norm (Qwen3, OLMo 2)      each head's q and k RMS-normalised over its d_k dims before q·k
    ALiBi (BLOOM)                -m_h·|i - j| added to each score: a slope a head, no positions learned
    relative bias (T5)           a learned number a head added for each bucket of the offset j - i
    soft-capping (Gemma 2)       each score s squashed to c·tanh(s / c), inside (-c, c)
    sink logits (gpt-oss)        one more logit a head in every row's softmax, learned, then dropped
    off-by-one softmax           the same sink fixed at 0: exp(s_j) / (1 + Σ exp(s))
    differential (DIFF)          two maps a head from the halves of q and k, the second taken away λ times

>>> Scoring(softcap=2.0).flags()
['--softcap 2']
"""

import math
from dataclasses import asdict, dataclass

from mha_trace.core.clashes import apart, judge
from mha_trace.errors import MhaError

SINKS = {"learned": "sink_logits", "zero": "off_by_one"}  # the module's sinks, and the flag of each


@dataclass(frozen=True)
class Scoring:
    qk_norm: bool = False
    softcap: float | None = None  # c: every score kept inside (-c, c)
    sinks: str | None = None  # "learned" (a logit a head, gpt-oss) | "zero" (the off-by-one softmax)
    alibi: bool = False  # ALiBi: the scores fall linearly with the query-key distance
    diff: bool = False  # differential attention: softmax(Q1 K1ᵀ) - λ softmax(Q2 K2ᵀ), each head normed
    relative_bias: bool = False  # T5: a learned bias a head for each bucket of the query-key offset

    @property
    def plain(self) -> bool:
        """The chapter's softmax(q·k/√d_k), nothing more."""
        return self == Scoring()

    def check_width(self, d_k: int, rope: bool = False) -> None:
        """Differential attention splits each head's q and k in halves: d_k must be even (and with
        RoPE, which turns pairs of each half, a multiple of 4)."""
        if self.diff and d_k % (4 if rope else 2):
            raise MhaError(f"differential attention splits each head's q and k in halves{', each turned by RoPE in pairs' * rope}, "
                           f"so d_k = {d_k} must be a multiple of {4 if rope else 2}", quantity="heads")

    def module_options(self) -> dict:
        return asdict(self)

    def flags(self) -> list[str]:
        """As the command line writes them: ['--qk-norm', '--softcap 30', '--sink-logits']."""
        return [f for f in ("--qk-norm" if self.qk_norm else None, "--alibi" if self.alibi else None,
                            "--relative-bias" if self.relative_bias else None,
                            None if self.softcap is None else f"--softcap {self.softcap:g}",
                            None if self.sinks is None else "--" + SINKS[self.sinks].replace("_", "-"),
                            "--diff" if self.diff else None) if f]

    def settings(self) -> str:
        """As a title writes them, each after a space: ' qk-norm softcap=30 sink-logits'."""
        return "".join(" " + f.removeprefix("--").replace(" ", "=") for f in self.flags())

    def named(self) -> list[str]:
        """In words, for a walk's title: ['QK-norm', 'soft-capped at 30', 'the off-by-one softmax']."""
        sink = {"learned": "a learned sink logit a head", "zero": "the off-by-one softmax", None: None}
        return [n for n in ("QK-norm" if self.qk_norm else None, "ALiBi" if self.alibi else None,
                            "T5's relative bias" if self.relative_bias else None,
                            None if self.softcap is None else f"soft-capped at {self.softcap:g}",
                            sink[self.sinks], "differential attention" if self.diff else None) if n]


# the paths that never form the scores (their rule is the module's; the wording one for every front end)
RULES = (apart("softcap", ("impl=sdpa", "impl=tiled"), "only the explicit path forms the scores it squashes"),
         apart("alibi", ("impl=sdpa", "impl=tiled"), "only the explicit path forms the scores it adds to"),
         apart("relative_bias", ("impl=sdpa", "impl=tiled"), "only the explicit path forms the scores it adds to"),
         apart("relative_bias", ("alibi",), "a head has one position bias: ALiBi's fixed slopes or T5's learned buckets"),
         apart("sink_logits", ("impl=sdpa", "impl=tiled"), "only the explicit path has a softmax to add a column to"),
         apart("off_by_one", ("impl=sdpa", "impl=tiled"), "only the explicit path has a softmax to add a column to"),
         apart("sink_logits", ("off_by_one",), "a head has one sink: a learned logit, or the off-by-one softmax's 0"),
         apart("diff", ("impl=sdpa", "impl=tiled", "alibi", "relative_bias", "softcap", "sink_logits", "off_by_one",
                        "window", "decode"),
               "differential attention is the explicit path's two maps, as the DIFF Transformer writes it"))


def scoring_of(qk_norm=False, softcap=None, sink_logits=False, off_by_one=False, impl=None,
               alibi=False, diff=False, window=None, decode=0, relative_bias=False) -> Scoring:
    """The options as given (the command line's or the API's), checked: a Scoring, or one Error."""
    for name, value in (("qk_norm", qk_norm), ("sink_logits", sink_logits), ("off_by_one", off_by_one),
                        ("alibi", alibi), ("diff", diff), ("relative_bias", relative_bias)):
        if not isinstance(value, bool):
            raise MhaError(f"{name} must be True or False, got {value!r}", quantity=name)
    if softcap is not None and (isinstance(softcap, bool) or not isinstance(softcap, (int, float))
                                or not 0 < softcap < math.inf):
        raise MhaError(f"softcap {softcap!r} must be a number above 0 (Gemma 2 caps its scores at 50)",
                       quantity="softcap")
    judge({"softcap": softcap, "sink_logits": sink_logits, "off_by_one": off_by_one, "alibi": alibi,
           "diff": diff, "relative_bias": relative_bias, "window": window, "decode": decode or None,
           "impl=sdpa": impl == "sdpa", "impl=tiled": impl == "tiled"}, RULES)
    sinks = "learned" if sink_logits else "zero" if off_by_one else None
    return Scoring(qk_norm, None if softcap is None else float(softcap), sinks, alibi, diff, relative_bias)
