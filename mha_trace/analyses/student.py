"""Is a student's own attention module right? Copy the reference weights into it, run both on the
same input and mask, compare, and when they differ, point at the first wrong step and say why.

The reference is the lecture's MultiHeadAttention (float64). The student's four projections are
found by name (W_q / query / q_proj ..., fused c_attn / qkv / in_proj) or, failing that, by shape,
or given with --map; the mapping used is always printed.
"""

import copy
import inspect
from dataclasses import dataclass, replace

import torch

from mha_trace.core.attention import MultiHeadAttention
from mha_trace.errors import MhaError
from mha_trace.analyses.projections import (BY_ORDER, Mapping, copy_reference, find_projections,
                                   named_weights, other_orders, square_matrices)
from mha_trace.analyses.verdict import StudentReport, differences, where_it_went_wrong


def check_student(runs, given_map: str | None = None, mask_means: str = "any") -> StudentReport:
    """The student's class against the lecture's module: `runs` is what `resolve.resolve_student`
    made of the options (the sizes, or a config)."""
    if mask_means not in MASK_WAYS:
        raise MhaError(f"'{mask_means}' is not one of {', '.join(MASK_WAYS)}",
                       quantity="mask-means")
    if runs.on_config:
        return check_on_config(*runs.on_config)
    report = check_module(runs, given_map, mask_means)
    report.notes += runs.notes
    return report


def check_on_config(run, reference_run) -> StudentReport:
    """The student's module on an explicit config's own Q, K, V, the lecture's module on the same
    (with identity projections, as `heads --config` runs it)."""
    from mha_trace.runs.returned import split_result

    config = reference_run.config
    if not run.numpy:
        run.module.double()
        run = replace(run, args=tuple(a.double() for a in run.args))
    traced = _traced_forward(run, run.module, run.args, {} if run.numpy else dict(run.kwargs))
    with torch.no_grad():
        expected, expected_w = reference_run.forward()
    output, weights = split_result(traced.output, run.args[0])
    report = StudentReport(run.label, f"(projections none: {run.how})", run.call,
                           *differences(output, weights, expected, expected_w), 1e-8)
    if config.W_O is not None:
        report.notes.append("the config's W_O is the lecture side's only: your module's output "
                            "projection is its own")
    if not report.passed:
        reference = reference_run.module
        where_it_went_wrong(report, traced, trace_reference(reference, reference_run),
                             (reference, tuple(reference_run.args), reference_run.mask),
                             output, expected, run.module)
    return report


def trace_reference(reference, reference_run):
    from mha_trace.core.tracer import trace

    return trace(reference, *reference_run.args, keep_values=True, **reference_run.kwargs)


def check_module(runs, given_map: str | None, mask_means: str = "any") -> StudentReport:
    """Build the student's module and the reference at the same sizes, share the weights, compare.
    A bare square weight matrix runs as x @ W and as x @ W.T: both are tried, and the one under
    which more of the computation is right is reported. With `sizes.rope` the lecture's module
    turns Q and K by RoPE, as the student's should."""
    sizes = runs.sizes
    run = runs.at(sizes)
    report = _best(_each_way(run, sizes, given_map, mask_means))
    if report.passed:
        return _exposed(runs, given_map, mask_means, report) or report  # confirmed there
    if not sizes.rope and _turns_positions(run):
        _right_with_rope(run, sizes, given_map, mask_means)
    if report.candidates:
        _confirm_at_a_second_size(report, runs, sizes, given_map, mask_means)
    return report


ROPE_WORDS = ("rotary", "rope", "freqs_cis", "rotate_half", ".cos(", "torch.cos", "np.cos", "polar(")


def _turns_positions(run) -> bool:
    """Whether the module's file reads like rotary positions (sin, cos, rotate_half)."""
    try:
        with open(run.source, encoding="utf-8") as f:
            text = f.read().lower()
    except OSError:
        return False
    return any(word in text for word in ROPE_WORDS)


def _right_with_rope(run, sizes, given_map, mask_means) -> None:
    """A module that turns Q and K by position, checked without --rope, is wrong against the
    plain module for that alone: when it is right with --rope, that is what is said."""
    try:
        right = _best(_each_way(run, replace(sizes, rope=True), given_map, mask_means)).passed
    except MhaError:
        return
    if right:
        name = run.label.split(" from ")[0]
        raise MhaError(f"{name} turns Q and K by their positions (rotary positions, RoPE), which "
                       f"the lecture's module does with --rope: check it with --rope (with it, "
                       f"it is right)", quantity="rope")


def _best(reports: list) -> StudentReport:
    # a known mistake that gives the student's very numbers says which reading was the author's
    return max(reports, key=lambda r: (r.passed, bool(r.candidates),
                                       r.first_wrong.index if r.first_wrong else 1e9, -r.output_diff))


def _exposed(runs, given_map, mask_means, right: StudentReport) -> StudentReport | None:
    """Right at the sizes given: the sizes and layouts that hide some mistakes are tried too (a
    batch of one hides a mixed-up batch, one head a merge without its transpose, a contiguous
    input a .view of x). The first that shows a mistake is the verdict, saying which."""
    s, tries = runs.sizes, []
    if s.batch < 2:
        tries.append((f"a batch of {s.batch}", "a batch of 3", replace(s, batch=3), False))
    if s.heads < 2 and s.d_model % 2 == 0:
        tries.append(("one head", "2 heads", replace(s, heads=2), False))
    tries.append(("a contiguous input", "a non-contiguous one (a (T, B, d_model) tensor "
                  "transposed to (B, T, d_model))", replace(s, batch=max(s.batch, 2)), True))
    for was, now, sizes, strided in tries:
        try:
            run = runs.at(sizes)
        except MhaError:  # --init fixes the sizes: these cannot be tried
            continue
        try:
            report = _best(_each_way(run, sizes, given_map, mask_means, strided))
        except MhaError as e:
            if strided and "forward raised" in e.message:  # loud, not wrong: a caveat
                right.notes.append(_needs_contiguous(e.message, now))
                continue
            raise MhaError(f"it is right with {was}, but with {now}: {e.message}",
                           e.exit_code, e.quantity) from None
        if not report.passed:
            report.notes.insert(0, f"it is right with {was}, but not with {now}: the check "
                                   f"tries both, and {now} shows the mistake")
            if report.candidates:
                _confirm_at_a_second_size(report, runs, sizes, given_map, mask_means)
            return report
    return None


def _needs_contiguous(message: str, fed: str) -> str:
    """A module that raises on a non-contiguous input (a .view of x) computes nothing wrong: it
    says so loudly, and a model feeds it a LayerNorm's contiguous output."""
    where = message.split(": forward raised", 1)[-1].split("): ", 1)[0]
    where = f"{where})" if where.startswith(" at ") else ""
    return (f"it needs a contiguous input: fed {fed}, its forward raises{where}; right as a model "
            f"feeds it (a LayerNorm's output is contiguous), but use .reshape() or .contiguous() "
            f"if it may be fed a transposed tensor")


def _confirm_at_a_second_size(report, runs, sizes, given_map, mask_means) -> None:
    """Name a mistake only if it gives the student's numbers at twice the width too (d_k doubles,
    √d_model does not): one size can make two mistakes look the same."""
    d_k = sizes.d_model // sizes.heads
    second = replace(sizes, d_model=2 * sizes.d_model,
                     seq=2 * sizes.seq if sizes.seq == d_k else sizes.seq)
    try:
        run = runs.at(second)
    except MhaError:  # --init fixes the width: one size is all there is
        report.notes.append(f"the diagnosis was seen at d_model={sizes.d_model} only (your "
                            f"--init fixes the sizes)")
        return
    seen = {c for r in _each_way(run, second, given_map, mask_means) for c in r.candidates}
    both = [c for c in report.candidates if c in seen]
    report.diagnosis = both[0] if both else None
    if not both:
        report.notes.append(f"a known mistake gave these numbers at d_model={sizes.d_model} but "
                            f"not at {second.d_model}, so none is named")


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
        return [n for n in (mask, fed, layout) if n]


MASK_WAYS = {"any": ("bool", "blocked", "0-1", "additive"), "keep": ("bool", "0-1", "additive"),
             "blocked": ("blocked",)}


def _each_way(run, sizes, given_map: str | None, mask_means: str = "any",
              strided: bool = False) -> list:
    """The student's module checked the usual way and, when it is not right that way, the other
    ways a correct module may be written: a bare square matrix used as x @ W (not x @ W.T), a mask
    of numbers, one sequence rather than a batch. A way that does not run is left out; if none
    runs, the usual way's error is the one given."""
    module = run.module if run.numpy else run.module.double().eval()
    _not_a_block(module, run.label, sizes.d_model)
    sizes, grouped = _grouped(module, sizes)
    kv_rows = sizes.kv_heads * (sizes.d_model // sizes.heads) if sizes.kv_heads else None
    mapping = find_projections(module, sizes.d_model, given_map, kv_rows) \
        if named_weights(module) or given_map else None
    turns = (False, True) if mapping is not None and square_matrices(mapping) else (False,)
    masks = _mask_ways(run, sizes, mask_means)
    batches = (True, False) if run.numpy else (False, True)  # NumPy: one sequence first
    layouts = (False, True) if mapping is not None and "qkv" in mapping.layers \
        and not sizes.kv_heads else (False,)
    # each of these is explained when wrong, and the one right the longest is the verdict's
    first = masks if masks[0] == "own" else masks[:1]
    usual = [Way(t, m, batches[0], strided, h) for h in layouts for m in first for t in turns]
    others = [Way(t, m, u, strided, h) for h in layouts for u in batches for m in masks
              for t in turns if Way(t, m, u, strided, h) not in usual]
    if not run.numpy:  # sequence first: only ever a way to be right, never a way to explain
        others += [Way(t, m, False, strided, h, True) for h in layouts for m in masks for t in turns]
    if not run.numpy and masks[0] != "own" and (sizes.mask != "none" or sizes.pad):
        others += [Way(t, m, False, strided, h, False, True) for h in layouts for m in masks
                   for t in turns]
    reports, error = [], None
    for way in usual:
        try:
            reports.append(_check_once(run, module, mapping, sizes, way))
        except MhaError as e:
            error = error or e
    if not any(r.passed for r in reports):
        passed = (r for r in (_try(run, module, mapping, sizes, way) for way in others)
                  if r is not None and r.passed)
        reports = [r for r in [next(passed, None)] if r] or reports
    if not reports:  # the usual way does not run: with one mask per sequence, or else the first
        reports = [r for r in (_try(run, module, mapping, sizes, replace(w, mask_per_sequence=True),
                                    True) for w in usual if sizes.mask != "none" or sizes.pad) if r]
    if not reports:  # way that runs is explained
        runs = (r for r in (_try(run, module, mapping, sizes, w, True) for w in others
                            if not w.seq_first) if r)
        reports = [r for r in [next(runs, None)] if r]
    if not reports:
        raise error
    if not any(r.passed for r in reports):
        reports = _in_another_order(run, module, mapping, sizes, usual) or reports
    for r in reports:
        r.notes[:0] = grouped
    return reports


NORMS = ("LayerNorm", "RMSNorm", "BatchNorm1d", "GroupNorm")
MLP_NAMES = {"mlp", "ffn", "feed_forward", "ff", "c_fc", "fc1", "fc2", "gate_proj", "up_proj",
             "down_proj"}


def _not_a_block(module, label: str, d_model: int) -> None:
    """A transformer block (norms, an MLP, residuals around attention) is refused, naming what
    it holds besides attention: it is never compared with attention alone."""
    if not isinstance(module, torch.nn.Module):
        return
    extra = [f"{name} ({type(m).__name__})" for name, m in module.named_modules()
             if type(m).__name__ in NORMS]
    extra += [f"{name} (an MLP layer, {m.in_features} → {m.out_features})"
              for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)
              and MLP_NAMES & set(name.lower().split("."))]
    if extra:
        name = label.split(" from ")[0]
        raise MhaError(f"{name} is not an attention module: besides attention it holds "
                       f"{', '.join(extra[:4])}{' and more' if len(extra) > 4 else ''}; verify "
                       f"checks one attention module (give the class its block calls for attention)",
                       quantity="module")


def _grouped(module, sizes) -> tuple:
    """(sizes, notes): K and V narrower than Q (grouped- or multi-query attention) are read from
    the module's weights when --kv-heads does not say so, and the lecture's module is built
    alike."""
    from mha_trace.analyses.projections import kv_rows_of

    d_k = sizes.d_model // sizes.heads
    rows = kv_rows_of(module, sizes.d_model)
    if rows is None or rows % d_k or sizes.heads % (rows // d_k):
        return sizes, []
    kv = rows // d_k
    if sizes.kv_heads not in (None, kv):
        raise MhaError(f"--kv-heads {sizes.kv_heads}, but its K and V projections have {rows} "
                       f"rows: {kv} heads of d_k={d_k}", quantity="kv_heads")
    kind = "multi-query attention" if kv == 1 else "grouped-query attention"
    return replace(sizes, kv_heads=kv), [
        f"its K and V have {kv} head{'s' * (kv > 1)} for {sizes.heads} query heads ({kind}), "
        f"so the lecture's module was built with kv_heads={kv}"]


def _mask_ways(run, sizes, mask_means: str) -> tuple:
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
    return ("bool",) if sizes.mask == "none" and not sizes.pad else MASK_WAYS[mask_means]


def _inputs(run, shape: tuple, strided: bool) -> list:
    """One input x, or for forward(q, k, v) three different ones (so that a swap shows), each
    (B, T, D) float64, or a (T, B, D) tensor transposed to (B, T, D) when `strided`."""
    from mha_trace.runs.usermodule import input_names

    B, T, D = shape
    make = lambda: torch.randn(T, B, D, dtype=torch.float64).transpose(0, 1) if strided \
        else torch.randn(shape, dtype=torch.float64)
    return [make() for _ in input_names(run.module)]


def _in_another_order(run, module, mapping: Mapping | None, sizes, ways: list) -> list:
    """Four square matrices whose names say nothing, wrong in the order they were defined: each
    other order is tried. Exactly one right: that one, said. More than one, or none: the weights
    cannot be aligned (exit 2), never a wrong verdict."""
    if mapping is None or mapping.how != BY_ORDER:
        return []
    right = []
    for candidate in other_orders(mapping, module, sizes.d_model):
        passed = [r for r in (_try(run, module, candidate, sizes, way) for way in ways)
                  if r is not None and r.passed]
        right += passed[:1]
    names = ", ".join(name for name, _ in mapping.layers.values())
    if len(right) == 1:
        right[0].notes.append(f"the names {names} do not say which projection each is; this is "
                              f"the one order of the 24 in which the module is right")
        return right
    raise MhaError(f"{names} do not say which projection each is, and "
                   f"{'more than one order' if right else 'no order'} of the 24 makes the module "
                   f"right: say which is which with --map, e.g. --map 'q=NAME,k=NAME,v=NAME,o=NAME'",
                   quantity="map")


def _try(run, module, mapping, sizes, way, explain: bool = False):
    try:
        return _check_once(run, module, mapping, sizes, way, explain=explain)
    except MhaError:
        return None


def _check_once(run, module, mapping: Mapping | None, sizes, way: Way,
                explain: bool = True) -> StudentReport:
    from mha_trace.runs.run import make_mask
    from mha_trace.core.tracer import trace
    from mha_trace.runs.returned import split_result
    from mha_trace.runs.usermodule import forward_call

    reference, mapping, biased = _reference_for(module, mapping, sizes, way)
    one = way.unbatched
    xs = _inputs(run, (1 if one else sizes.batch, sizes.seq, sizes.d_model), way.strided)
    x = xs[0]
    mask = make_mask(sizes.seq, "causal" if way.mask_as == "own causal" else sizes.mask, sizes.pad)
    fed = tuple(t[0] if one else t.transpose(0, 1).contiguous() if way.seq_first else t for t in xs)
    fed = tuple(t.numpy() for t in fed) if run.numpy else fed
    given = None if way.mask_as.startswith("own") else _mask_as(mask, way.mask_as, run.numpy)
    if way.mask_per_sequence and given is not None:
        given = given.expand(len(xs[0]), *given.shape).clone()  # (B, T, T)
    call, args, kwargs = forward_call(module, fed if len(fed) == 3 else fed[0], given)
    if "use_projections" in inspect.signature(module.forward).parameters and mapping.layers:
        kwargs["use_projections"] = True  # the chapter's class: let it use the copied weights
        call = call[:-1] + ", use_projections=True)"
    with torch.no_grad():
        expected, expected_w = reference(*xs, mask=mask)
    traced = _traced_forward(run, module, args, kwargs)
    output, weights = split_result(traced.output, fed[0])
    output = output.transpose(0, 1) if way.seq_first and output.dim() == 3 else output
    report = StudentReport(run.label, mapping.describe(), call,
                           *differences(output, weights, expected, expected_w), 1e-8,
                           numpy=run.numpy)
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
    report.notes += way.notes(run.numpy) + _dropout(module)
    if not report.passed and explain:
        where_it_went_wrong(report, traced, trace(reference, *xs, mask=mask, keep_values=True),
                             (reference, tuple(xs) if len(xs) == 3 else x, mask), output, expected,
                             module, lowered[1] if lowered else 1e-9)
    return report


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
    torch.manual_seed(sizes.seed)
    reference = MultiHeadAttention(sizes.d_model, sizes.heads, kv_heads=sizes.kv_heads,
                                   rope=sizes.rope, rope_base=sizes.rope_base).double()
    if mapping is not None:
        return reference, mapping, copy_reference(reference, mapping, module, way.transposed,
                                                  way.head_by_head)
    with torch.no_grad():
        for lin in (reference.W_q, reference.W_k, reference.W_v, reference.W_o):
            lin.weight.copy_(torch.eye(sizes.d_model, dtype=torch.float64))
            lin.bias.zero_()
    return reference, Mapping({}, "none: it splits Q, K, V as given, so the lecture's projections "
                                  "were set to the identity"), True


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


def _traced_forward(run, module, args: tuple, kwargs: dict):
    """The student's forward, traced op by op with every value kept, under the user-code guard;
    a failure is one error naming it."""
    from mha_trace.runs.usermodule import explain_exception, user_code

    if run.numpy:
        from mha_trace.core import nptrace as tracer
    else:
        from mha_trace.core import tracer
    try:
        with torch.no_grad(), user_code(f"{run.label}: forward"):
            return tracer.trace(module, *args, watch=(run.source,), keep_values=True, **kwargs)
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


