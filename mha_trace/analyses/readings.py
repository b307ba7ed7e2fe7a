"""One reading of a student's module: how it is fed (a `Way`: the mask as booleans either way round,
numbers or added, or none for a forward that masks by itself; a batch or one sequence, sequence
first; a bare matrix as x @ W or x @ W.T; a fused qkv stacked or head by head) and its check under
that reading against the lecture's module with the same weights, in float64, judged at the
precision the module computes in."""

import copy
import inspect
from dataclasses import dataclass

import torch

from mha_trace.analyses.copied import copy_reference, square_matrices, take_scoring
from mha_trace.analyses.projections import Mapping
from mha_trace.analyses.verdict import StudentReport, differences, where_it_went_wrong
from mha_trace.core.attention import MultiHeadAttention
from mha_trace.core.runtime import seed
from mha_trace.errors import MhaError


@dataclass(frozen=True)
class Way:
    """How the student's module is read and fed: a bare square matrix as x @ W.T or x @ W; the
    mask as booleans (True: may attend, or True: blocked), as 1/0 or added (0 / -inf); a batch
    or one sequence."""

    transposed: bool = False
    mask_as: str = "bool"
    unbatched: bool = False
    strided: bool = False  # fed a non-contiguous input
    head_by_head: bool = False  # a fused qkv's rows go head by head
    seq_first: bool = False  # fed (T, B, d_model), as fairseq and nn.MultiheadAttention take it
    mask_per_sequence: bool = False  # the mask (B, T, T), one per sequence (the Annotated Transformer's)
    key_padding: bool = False  # the mask (B, T), one row of the keys per sequence (BERT's attention_mask)
    heads_axis: bool = False  # the mask (B, 1, T, T): per sequence, with an axis for the heads (Hugging Face's)

    def notes(self, numpy: bool = False) -> list:
        mask = {"own causal": "it masks causally by itself (its forward takes no mask), so it was "
                              "compared with the lecture's module under a causal mask: right for "
                              "a decoder; it cannot be given a padding mask",
                "0-1": "its mask is read as numbers, 1 where a query may attend and 0 where not",
                "additive": "its mask is added to the scores: 0 where a query may attend, -inf "
                            "where not",
                "blocked": "its mask means True where a query may NOT attend (the convention of "
                           "the chapter \"Multi-Head Attention\" and nn.MultiheadAttention; the "
                           "lecture's is True where it may), and it was fed so; if you meant True "
                           "where it may, the mask is inverted (--mask-means keep checks that)"
                }.get(self.mask_as)
        fed = ("it takes a batch (B, T, d_model), so it was fed one" if numpy and not self.unbatched
               else "it takes one sequence (T, d_model), so it was fed one, unbatched"
               if self.unbatched and not numpy else None)
        layout = ("its fused qkv holds each head's q, k and v side by side (its rows go head by "
                  "head, as a reshape to (B, T, H, 3·d_k) reads them: the UvA tutorials' layout), "
                  "so the lecture's weights were laid out so") if self.head_by_head else None
        if self.seq_first:
            fed = ("it takes (T, B, d_model), sequence first (fairseq's layout, and "
                   "nn.MultiheadAttention's without batch_first), so it was fed so")
        if self.mask_per_sequence:
            mask = (mask + "; one (T, T) mask per sequence, (B, T, T)") if mask else \
                "its mask is one (T, T) mask per sequence, (B, T, T)"
        if self.heads_axis:
            mask = mask.replace("(B, T, T)", "(B, 1, T, T), with an axis for the heads, as Hugging Face's "
                                "attention classes take it")
        if self.key_padding:
            mask = (mask + "; one row of the keys per sequence, (B, T)") if mask else \
                "its mask is one row of the keys per sequence, (B, T), as BERT's attention_mask: padding"
        return [n for n in (mask, fed, layout) if n]


MASK_WAYS = {"any": ("bool", "blocked", "0-1", "additive"), "keep": ("bool", "0-1", "additive"),
             "blocked": ("blocked",)}


def mask_ways(run, sizes, mask_means: str) -> tuple:
    """How the mask is given: as booleans either way round, numbers, or added; or, to a forward
    that takes no mask, not at all (it attends to every key, or masks causally by itself)."""
    from mha_trace.runs.usermodule import takes_lengths, takes_mask

    name = run.label.split(" from ")[0]
    if not takes_mask(run.module) and takes_lengths(run.module) and (sizes.pad or sizes.mask != "none"):
        raise MhaError(f"{name}.forward takes {takes_lengths(run.module)} (how many keys of each "
                       f"sequence count), not a mask: it is checked without --mask and --pad",
                       quantity="pad" if sizes.pad else "mask")
    if not takes_mask(run.module):
        if sizes.pad:
            raise MhaError(f"{name}.forward takes no mask argument, so no padding mask can be "
                           f"applied", quantity="pad")
        return ("own", "own causal") if sizes.mask == "none" else ("own causal",)
    if sizes.mask == "causal" and takes_mask(run.module) == "key_padding_mask":
        raise MhaError(f"{name}.forward takes key_padding_mask, the (B, T) keys to leave out: a causal "
                       f"mask cannot be given that way (--pad can)", quantity="mask")
    return ("bool",) if sizes.mask == "none" and not sizes.pad else MASK_WAYS[mask_means]


def inputs(run, shape: tuple, strided: bool) -> list:
    """One input x, or for forward(q, k, v) three different ones (so that a swap shows), each
    (B, T, D) float64, or a (T, B, D) tensor transposed to (B, T, D) when `strided`."""
    from mha_trace.runs.usermodule import input_names

    B, T, D = shape
    make = lambda: torch.randn(T, B, D, dtype=torch.float64).transpose(0, 1) if strided \
        else torch.randn(shape, dtype=torch.float64)
    return [make() for _ in input_names(run.module)]


def try_way(run, module, mapping, sizes, way, explain: bool = False):
    try:
        return check_once(run, module, mapping, sizes, way, explain=explain)
    except MhaError:
        return None


def check_once(run, module, mapping: Mapping | None, sizes, way: Way,
               explain: bool = True) -> StudentReport:
    """The student's module read one way against the lecture's, explained where it is wrong."""
    report, why = measured(run, module, mapping, sizes, way)
    if explain:
        why()
    return report


def measured(run, module, mapping: Mapping | None, sizes, way: Way) -> tuple:
    """(the report of one reading, a function that explains it where it is wrong): a reading
    that another one's Right replaces is never explained (the search for its mistake is the
    costliest part of a check)."""
    from mha_trace.runs.run import make_mask
    from mha_trace.core.tracer import trace
    from mha_trace.runs.returned import split_result
    from mha_trace.runs.usermodule import forward_call

    reference, mapping, biased = _reference_for(module, mapping, sizes, way)
    one = way.unbatched
    xs = inputs(run, (1 if one else sizes.batch, sizes.seq, sizes.d_model), way.strided)
    x = xs[0]
    mask = make_mask(sizes.seq, "causal" if way.mask_as == "own causal" or sizes.window else sizes.mask,
                     sizes.pad, window=sizes.window)  # a sliding window: causal, within it (Mistral's)
    fed = tuple(t[0] if one else t.transpose(0, 1).contiguous() if way.seq_first else t for t in xs)
    fed = tuple(t.numpy() for t in fed) if run.numpy else fed
    given = _mask_given(mask, way, run.numpy, len(xs[0]))
    call, args, kwargs = forward_call(module, fed if len(fed) == 3 else fed[0], given)
    if "use_projections" in inspect.signature(module.forward).parameters and mapping.layers:
        kwargs["use_projections"] = True  # the chapter's class: let it use the copied weights
        call = call[:-1] + ", use_projections=True)"
    with torch.no_grad():
        expected, expected_w = reference(*xs, mask=mask)
    traced = traced_forward(run, module, args, kwargs)
    output, weights = split_result(traced.output, fed[0])
    output = output.transpose(0, 1) if way.seq_first and output.dim() == 3 else output
    report = StudentReport(run.label, mapping.describe(), call,
                           *differences(output, weights, expected, expected_w), 1e-8,
                           numpy=run.numpy,
                           rotates=any(s.op in ("cos", "sin", "polar", "view_as_complex")
                                       for s in traced.steps))
    lowered = _lowered(traced.steps, expected)
    if not report.passed and sizes.rope:
        _other_rope_convention(report, reference, xs, mask, output, weights,
                               lowered[1] if lowered else report.tolerance)
    if not report.passed and lowered:
        _within_precision(report, *lowered)
    if not biased:
        report.notes.append("its projections have no biases, so the reference's were set to zero")
    if mapping.stray:
        report.notes.append(f"the biases {', '.join(n for n, _ in mapping.stray)} were set to zero, "
                            f"as were the reference's: no projection's name claims them")
    if square_matrices(mapping):
        report.notes.append(f"its weight matrices are used as "
                            f"{'x @ W' if way.transposed else 'x @ W.T'} (both ways round were tried)")
    report.notes += way.notes(run.numpy) + _dropout(module) + _windowed(sizes)
    why = lambda: None if report.passed else where_it_went_wrong(
        report, traced, trace(reference, *xs, mask=mask, keep_values=True),
        (reference, tuple(xs) if len(xs) == 3 else x, mask), output, expected, module,
        lowered[1] if lowered else 1e-9)
    return report, why


LOWER = ("float32", "float16", "bfloat16")  # from the finest: the coarsest found sets the tolerance


MADE = ("arange", "zeros", "ones", "full", "empty", "tensor", "linspace", "randn", "rand")


def _lowered(steps, expected) -> tuple | None:
    """(the step that lowered the precision, the tolerance it sets) for a module that computes
    part of its work in float32, float16 or bfloat16 (a softmax upcast to float32, a kernel run
    in bfloat16): that precision's tolerance relative to the largest output value, as verify
    judges the lecture's module in that dtype. None: all in float64."""
    from mha_trace.analyses.references import TOLERANCE

    found = [s for s in steps if s.dtype in LOWER and s.op != "input"]
    if not found:
        return None
    worst = max(LOWER.index(s.dtype) for s in found)
    found = [s for s in found if LOWER.index(s.dtype) == worst]
    computed = [s for s in found if s.op not in MADE and LOWER[worst] in s.source]  # the cast
    coarsest = (computed or found)[0]
    return coarsest, TOLERANCE[coarsest.dtype] * max(float(expected.abs().max()), 1.0)


def _within_precision(report, coarsest, tolerance: float) -> None:
    """Rounding is not a mistake: a module right within its lower precision's tolerance is Right,
    with the step that lowered it named."""
    if report.output_diff > tolerance or (report.weights_diff or 0.0) > tolerance:
        return
    where = f"{coarsest.file.rsplit('/', 1)[-1]}:{coarsest.line}" if coarsest.line else "its forward"
    report.tolerance = tolerance
    report.notes.append(f"it computes in {coarsest.dtype} ({where}: {coarsest.source.strip()}), so "
                        f"it was judged at {coarsest.dtype}'s tolerance, {tolerance:.0e}: right "
                        f"within {coarsest.dtype} precision (the largest difference is "
                        f"{max(report.output_diff, report.weights_diff or 0.0):.1e})")


def _dropout(module) -> list:
    """A note when the module drops weights at random in training: it is checked in eval mode,
    as it runs at inference (in training its output is off by design, by 1/(1-p) and zeros)."""
    if not isinstance(module, torch.nn.Module):
        return []
    found = sorted({m.p for m in module.modules() if isinstance(m, torch.nn.Dropout) and m.p > 0})
    try:
        called = "dropout(" in inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        called = False
    if not found and not called:
        return []
    p = f" (p={', '.join(f'{v:g}' for v in found)})" if found else ""
    return [f"it has dropout{p}, so it was run in eval mode (module.eval()), as at inference: in "
            f"training mode dropout zeroes weights at random and scales the rest by 1/(1-p)"]


def _reference_for(module, mapping: Mapping | None, sizes, way: Way) -> tuple:
    """(the lecture's module with the student's weights, the mapping, whether biases are used).
    Without projections of its own (the chapter's split) the lecture's become the identity."""
    seed(sizes.seed)
    reference = MultiHeadAttention(sizes.d_model, sizes.heads, kv_heads=sizes.kv_heads,
                                   rope=sizes.rope, rope_base=sizes.rope_base, rope_dims=sizes.rope_dim,
                                   **sizes.scoring.module_options()).double()
    take_scoring(reference, module)
    if mapping is not None:
        return reference, mapping, copy_reference(reference, mapping, module, way.transposed,
                                                  way.head_by_head)
    with torch.no_grad():
        for lin in (reference.W_q, reference.W_k, reference.W_v, reference.W_o):
            lin.weight.copy_(torch.eye(sizes.d_model, dtype=torch.float64))
            lin.bias.zero_()
    return reference, Mapping({}, "none: it splits Q, K, V as given, so the lecture's projections "
                                  "were set to the identity"), True


def _windowed(sizes) -> list:
    return [f"it was compared with the lecture's module under a sliding window of {sizes.window} keys, "
            f"causal (--window)"] if sizes.window else []


def _mask_given(mask, way: Way, numpy: bool, batch: int):
    """The mask as the student's forward takes it: read its way, in its layout ((T, T); one per
    sequence, (B, T, T); padding as one row of keys per sequence, (B, T)); None for its own."""
    given = None if way.mask_as.startswith("own") else _mask_as(mask, way.mask_as, numpy)
    if way.mask_per_sequence and given is not None:
        given = given.expand(batch, *given.shape).clone()  # (B, T, T)
    if way.heads_axis and given is not None:
        given = given.unsqueeze(1)  # (B, 1, T, T)
    if way.key_padding and given is not None:
        given = given[0].expand(batch, *given.shape[1:]).clone()  # (B, T): padding is one row
    return given


def _mask_as(mask, kind: str, numpy: bool):
    """The boolean mask (True: may attend) as the student's module takes it."""
    if mask is None:
        return None
    if kind == "blocked":
        mask = ~mask
    elif kind != "bool":
        mask = mask.double() if kind == "0-1" else torch.zeros(mask.shape, dtype=torch.float64) \
            .masked_fill(~mask, float("-inf"))
    return mask.numpy() if numpy else mask


def _other_rope_convention(report, reference, xs, mask, output, weights, tolerance: float) -> None:
    """Pass a module whose RoPE turns interleaved pairs: it is the lecture's with each head's Q
    and K dims reordered (evens, then odds), which leaves every Q·Kᵀ as it is."""
    d_k, twin = reference.d_k, copy.deepcopy(reference)
    pairs = torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])
    with torch.no_grad():
        for lin in (twin.W_q, twin.W_k):  # K has kv_heads heads
            order = torch.cat([pairs + h * d_k for h in range(lin.weight.shape[0] // d_k)])
            lin.weight.copy_(lin.weight[order])
            lin.bias.copy_(lin.bias[order])
        expected, expected_w = twin(*xs, mask=mask)
    diffs = differences(output, weights, expected, expected_w)
    if max(d for d in diffs if d is not None) <= tolerance:
        report.output_diff, report.weights_diff = diffs
        report.notes.append("its RoPE turns neighbouring pairs (x₀, x₁), (x₂, x₃), … as GPT-J and "
                            "RoFormer do, where the lecture's turns the two halves (x₀, x_{d_k/2}), "
                            "… as GPT-NeoX and LLaMA do: a convention, not a mistake (it equals the "
                            "lecture's module with each head's Q and K dims reordered, which leaves "
                            "Q·Kᵀ as it is)")


def traced_forward(run, module, args: tuple, kwargs: dict):
    """The student's forward, traced op by op with every value kept, under the user-code guard;
    a failure is one error naming it."""
    from mha_trace.runs.usermodule import explain_exception, user_code

    from mha_trace.core import nptrace, tracer

    trace = nptrace.trace if run.numpy else tracer.trace
    try:
        with torch.no_grad(), user_code(f"{run.label}: forward"):
            return trace(module, *args, watch=(run.source,), keep_values=True, **kwargs)
    except tracer.ForwardFailed as failed:
        from mha_trace.io.output import display_path

        f = failed.trace.failure
        where = f" at {display_path(f.file)}:{f.line} ({f.source.strip()})" if f.line else ""
        raise MhaError(f"{run.label}: forward raised{where}: {f.message}"
                       + (f" (hint: {f.hint})" if f.hint else ""), exit_code=1) from None
    except MhaError:
        raise
    except Exception as e:
        raise MhaError(f"{run.label}: forward raised {explain_exception(e)}", exit_code=1) from None
