"""A student's verdict: Right or Wrong, how far the outputs differ, the first step that did its job
wrong, and the known mistake that gives the same numbers (with its fix)."""

import inspect
from dataclasses import dataclass, field, replace

import torch

from mha_trace.analyses.diagnosis import diagnoses
from mha_trace.analyses.mistakes import fix_of
from mha_trace.core.roles import first_wrong_step
from mha_trace.records import Shows


@dataclass
class StudentReport(Shows):
    """A student's module against the lecture's: Right or Wrong, the first wrong line, the
    diagnosis. Prints as the terminal's verdict; in Jupyter, the same as HTML."""

    label: str
    mapping: str
    fed: str
    output_diff: float
    weights_diff: float | None  # None: the module returns no per-head weights
    tolerance: float
    first_wrong: object = None  # tracer.Step of the student's first step no reference step holds
    reference_step: object = None  # the lecture's step that does the same job
    missing: str | None = None  # a job the lecture's module does after the first wrong step
    diagnosis: str | None = None
    candidates: list = field(default_factory=list)  # every known mistake that matched
    notes: list = field(default_factory=list)
    numpy: bool = False  # a NumPy module: its fix is written in NumPy
    own_fix: str | None = None  # a fix for this module's own line, where the mistake's would mislead
    rotates: bool = False  # its forward computed cosines or complex turns (RoPE, maybe)
    variant: str | None = None  # a variant of attention the lecture's module does not have (QK-norm ...)
    reading: str | None = None  # no known mistake: what the first wrong step's numbers are (times 3)

    @property
    def fix(self) -> str | None:
        """The diagnosed mistake's one-sentence fix, in NumPy for a NumPy module."""
        fix = self.own_fix or fix_of(self.diagnosis)
        return in_numpy(fix) if fix and self.numpy else fix

    @property
    def passed(self) -> bool:
        return self.output_diff <= self.tolerance and (
            self.weights_diff is None or self.weights_diff <= self.tolerance)


NUMPY_WORDS = (("torch.softmax(scores, dim=-1)", "np.exp(s) / np.exp(s).sum(axis=-1, keepdims=True), "
                 "s = scores - scores.max(axis=-1, keepdims=True)"),
               ("scores.masked_fill(~mask, float('-inf'))", "np.where(mask, scores, -np.inf)"),
               ("float('-inf')", "-np.inf"), ("masked_fill", "np.where"), ("math.sqrt", "np.sqrt"),
               ("transpose(-2, -1)", "swapaxes(-2, -1)"), ("dim=", "axis="), ("tril()", "np.tril"),
               ("view(", "reshape("), ("view as", "reshape as"), ("transpose(1, 2)", "swapaxes(1, 2)"))


def in_numpy(fix: str) -> str:
    """A fix written with torch's names, in NumPy's (axis for dim, np.where for masked_fill)."""
    for torch_words, numpy_words in NUMPY_WORDS:
        fix = fix.replace(torch_words, numpy_words)
    return fix


def as_expected(output, expected):
    """The output in the reference's (B, T, d_model) shape when it is that or, for a batch of
    one, unbatched (T, d_model), as a NumPy class returns; any other shape stays as it is (a
    flattened output is wrong, whatever its values)."""
    unbatched = expected.shape[0] == 1 and output.shape == expected.shape[1:]
    return output.reshape(expected.shape) if unbatched else output


def differences(output, weights, expected, expected_w) -> tuple[float, float | None]:
    """(largest output difference, largest weights difference or None): an unbatched output or
    weights are compared reshaped, weights averaged over heads against the average."""
    output = as_expected(output, expected)
    diff = float((output.double() - expected).abs().max()) if output.shape == expected.shape \
        else float("inf")
    if weights is None:
        return diff, None
    w = weights.double()
    if w.shape != expected_w.shape and w.numel() == expected_w.numel():
        w = w.reshape(expected_w.shape)  # unbatched (H, T, T), as a NumPy class returns
    if w.shape == expected_w.shape:
        return diff, float((w - expected_w).abs().max())
    if w.numel() == expected_w.mean(1).numel():  # a module that averages its heads
        return diff, float((w.reshape(expected_w.mean(1).shape) - expected_w.mean(1)).abs().max())
    return diff, None


def where_it_went_wrong(report, traced, ref_trace, diagnose_args: tuple, output, expected,
                         module, atol: float = 1e-9) -> None:
    """A wrong module's first wrong step, the reference's step beside it, and a diagnosis."""
    report.first_wrong, report.reference_step, report.missing = first_wrong_step(
        traced.steps, ref_trace.steps)
    output = as_expected(output, expected)
    if output.shape != expected.shape:
        report.notes.append(f"its output has shape {list(output.shape)}; the lecture's has "
                            f"{list(expected.shape)} (batch, seq, d_model)")
    if output.shape == expected.shape:
        reference, x, mask = diagnose_args
        report.candidates = diagnoses(reference, x, mask, output, atol)
        report.diagnosis = report.candidates[0] if report.candidates else None
        _shown_at(report, traced, ref_trace)
    if report.first_wrong is None:
        _returned_too_early(report, traced, ref_trace, module, output)
    if report.diagnosis == "mask never applied":
        _discarded_mask(report, traced, ref_trace)
    _dropout_left_on(report, traced)
    if report.diagnosis is None:
        reference = diagnose_args[0]
        _variant(report, traced, expected.shape[-2], reference)
        if report.variant is None:
            _window(report, traced, expected.shape[-2])
        if report.variant is None and report.rotates and not reference.rope_dims:  # --rope-dim runs it
            _partial_rope(report, traced, reference.d_k)
    if report.diagnosis is None and report.variant is None:
        report.reading = _what_the_step_did(report.first_wrong, report.reference_step)


def _shown_at(report, traced, ref_trace) -> None:
    """A mistake that moves a step (the cap after the softmax) is named at the student's step of
    that op, beside the lecture's, not where the first value differs."""
    from mha_trace.analyses.mistakes import SHOWN_AT

    op, rank = SHOWN_AT.get(report.diagnosis or "", (None, None))
    step = next((s for s in traced.steps if s.op == op and len(s.shape) == rank), None)
    if op and step is not None:
        report.first_wrong, report.missing = step, None
        report.reference_step = next((r for r in ref_trace.steps if r.op == op), None)


VARIANTS = (  # (what names it in a step, the variant): read off the student's trace, in order
    (lambda s, T, H, d: s.op == "sub" and tuple(s.shape[-2:]) == (T, T) and len(s.inputs) == 2
     and all(tuple(i[-2:]) == (T, T) for i in s.inputs),
     "differential attention (DIFF Transformer): one map of weights taken away from another; --diff checks it"),
    (lambda s, T, H, d: s.op == "tanh" and tuple(s.shape[-2:]) == (T, T),
     "logit soft-capping (Gemma 2): the scores squashed as c·tanh(s / c) before the softmax; --softcap C "
     "checks it"),
    (lambda s, T, H, d: s.op in ("rms_norm", "layer_norm", "normalize") and tuple(s.shape[-2:]) == (T, d),
     "QK-norm (Qwen3, OLMo 2): q or k normalised over each head's d_k dims before q·k; --qk-norm checks it"),
    (lambda s, T, H, d: s.op == "cat" and tuple(s.shape[-2:]) == (T, T + 1)
     and any(tuple(i[-2:]) == (T, T) for i in s.inputs),
     "a sink logit (gpt-oss): one more column in each row's softmax that no key stands behind; "
     "--sink-logits checks it (--off-by-one, fixed at 0)"),
    (lambda s, T, H, d: s.op in ("add", "add_") and tuple(s.shape[-2:]) == (T, T) and any(
        len(i) >= 3 and tuple(i[-2:]) == (T, T) and H in tuple(i[-4:-2]) and tuple(i[:1]) != tuple(s.shape[:1])
        for i in s.inputs),
     "a position bias added to the scores, one (T, T) a head (ALiBi, T5's or Swin's relative bias); "
     "--alibi checks ALiBi's, --relative-bias T5's"),
)


def _what_the_step_did(step, reference) -> str | None:
    """For a mistake none of the known ones gives: what the first wrong step's numbers are, next
    to the lecture's step of the same job, read in code of any shape (the lecture's times a
    constant; its last two axes swapped; weights that sum to 1 over another axis)."""
    if step is None or reference is None or step.value is None or reference.value is None \
            or tuple(step.value.shape) != tuple(reference.value.shape) or not step.value.is_floating_point():
        return None
    mine, theirs = step.value.double(), reference.value.double()
    if not torch.equal(torch.isfinite(mine), torch.isfinite(theirs)):
        return None  # masked where the lecture's is not, or the other way: not one job's numbers
    finite = torch.isfinite(mine) & (theirs.abs() > 1e-6)
    if finite.any():
        c = float((mine[finite] / theirs[finite]).median())
        if abs(c - 1) > 1e-6 and torch.allclose(mine[finite], c * theirs[finite], rtol=1e-6, atol=1e-9):
            return f"its numbers are the lecture's times {c:.6g}"
    if mine.dim() >= 2 and mine.shape[-1] == mine.shape[-2] and torch.allclose(mine, theirs.transpose(-2, -1), atol=1e-9):
        return "its numbers are the lecture's with the last two axes swapped"
    if mine.dim() >= 2 and mine.min() >= 0 and torch.allclose(mine.sum(-2), torch.ones_like(mine.sum(-2)), atol=1e-6):
        return "its weights sum to 1 over the queries (axis -2), not over the keys"
    return None


RUNS = {"differential": ("diff",), "logit soft-capping": ("softcap",), "QK-norm": ("qk_norm",),
        "a sink logit": ("sinks",), "a position bias": ("alibi", "relative_bias")}


def _variant(report, traced, T: int, reference) -> None:
    """A step that makes attention a variant the lecture's module was not asked to run, named with
    its line as that, not as a mistake (its numbers differ for a reason the lecture does not teach).
    A variant its flag already runs is not named: that module's numbers differ for another reason."""
    H, d_k = reference.heads, reference.d_k
    asked = lambda name: any(name.startswith(k) and getattr(reference, a, None) not in (None, False)
                             for k, runs in RUNS.items() for a in runs)
    for step in traced.steps:
        found = next((name for test, name in VARIANTS if test(step, T, H, d_k) and not asked(name)), None)
        if found:
            report.variant, report.first_wrong, report.reference_step, report.missing = found, step, None, None
            return


def _window(report, traced, T: int) -> None:
    """A mask of the module's own that lets each query see only its last W keys, itself included
    (Mistral's sliding window): named as the variant it is, with the flag that checks it."""
    for step in traced.steps:
        if step.op not in ("masked_fill", "masked_fill_", "where", "add") or step.value is None \
                or tuple(step.value.shape[-2:]) != (T, T) or not step.value.is_floating_point():
            continue
        seen = ~torch.isneginf(step.value.reshape(-1, T, T)[0])
        width = int(seen[-1].sum())
        band = torch.ones(T, T, dtype=torch.bool).tril() & ~torch.ones(T, T, dtype=torch.bool).tril(-width)
        if 1 <= width < T and torch.equal(seen, band):
            report.variant, report.first_wrong, report.reference_step, report.missing = (
                f"a sliding window of {width} keys (Mistral's): each query sees itself and the {width - 1} "
                f"keys before it; --window {width} checks it", step, None, None)
            return


def _partial_rope(report, traced, d_k: int) -> None:
    """Rotary positions on part of each head's dims (Phi's, GPT-J's rotary_dim): a d_k-wide
    concatenation of which one part is a slice of a head's dims passed through untouched."""
    at = {s.index: s for s in traced.steps}
    for step in traced.steps:
        if step.op != "cat" or not step.shape or step.shape[-1] != d_k:
            continue
        passed = [at[i] for i in step.parents if i in at and at[i].op in ("index", "getitem", "narrow")
                  and at[i].shape[-1] < d_k and any(j in at and at[j].shape[-1] == d_k for j in at[i].parents)]
        if passed:
            turned = d_k - passed[0].shape[-1]
            report.variant, report.first_wrong, report.reference_step, report.missing = (
                f"partial RoPE (Phi's, GPT-J's): only {turned} of each head's {d_k} dims turn with "
                f"position, the other {d_k - turned} pass through; --rope --rope-dim {turned} checks it", step, None, None)
            return


def _dropout_left_on(report, traced) -> None:
    """A dropout that changed its input while the module ran in eval mode (F.dropout(x, p) keeps
    training=True unless told): seen in the values, whatever the code's shape, it is named at its
    line, before whatever it made differ downstream."""
    steps = [s for s in traced.steps if s.value is not None]
    for before, step in zip(steps, steps[1:]):
        if "dropout" in step.op and tuple(before.value.shape) == tuple(step.value.shape) \
                and not torch.allclose(before.value, step.value, rtol=0, atol=0, equal_nan=True):
            report.first_wrong, report.reference_step, report.missing = step, None, None
            report.diagnosis, report.candidates = DROPOUT_ON, [DROPOUT_ON]
            report.own_fix = ("pass training=self.training to F.dropout (or use nn.Dropout), so that "
                              "eval mode turns it off")
            return


DROPOUT_ON = "dropout left on: it drops weights at random even in eval mode"


def _discarded_mask(report, traced, ref_trace) -> None:
    """A mask computed right and never used (`scores.masked_fill(...)` without `scores =`): the
    line that drops it is named, and the fix is to keep its result, not to write masked_fill."""
    from mha_trace.core.roles import holds_masked

    masked = [r for r in ref_trace.steps if r.op in ("masked_fill", "where") and r.value is not None]
    for step in traced.steps:
        if step.op in ("masked_fill", "where") and step.value is not None and masked \
                and holds_masked(step.value, masked[0].value):
            report.first_wrong, report.reference_step, report.missing = step, masked[0], None
            report.own_fix = ("masked_fill returns a new tensor, and this line drops it: keep it, "
                              "scores = scores.masked_fill(~mask, float('-inf')), or fill in place "
                              "with masked_fill_")
            report.notes.append("its mask is computed right, then never used")
            return


def _returned_too_early(report, traced, ref_trace, module, output) -> None:
    """Every step right, yet the output is not the lecture's: when it is what the lecture's
    module holds part-way (W_O never applied), the return line in forward is named, beside the
    lecture's step that comes next."""
    import ast
    import textwrap

    known = [r for r in ref_trace.steps if r.value is not None and r.op != "input"]
    held = [i for i, r in enumerate(known) if tuple(r.value.shape) == tuple(output.shape)
            and torch.allclose(r.value.double(), output.double(), rtol=1e-6, atol=1e-9)]
    if not held or held[-1] + 1 >= len(known) or not traced.steps:
        return
    forward = traced.steps[-1]
    try:
        lines, start = inspect.getsourcelines(type(module).forward)
        returns = [n for n in ast.walk(ast.parse(textwrap.dedent("".join(lines))))
                   if isinstance(n, ast.Return)]
    except (TypeError, OSError, SyntaxError, AttributeError):
        return
    if returns:
        line = start + returns[-1].lineno - 1
        forward = replace(forward, line=line, source=lines[returns[-1].lineno - 1].strip(),
                          called_from=())
    nxt = known[held[-1] + 1]
    report.first_wrong, report.reference_step = forward, nxt
    report.missing = (f"yours returns what the lecture's module holds at attention.py:"
                      f"{known[held[-1]].line}; it goes on to {nxt.source}")
