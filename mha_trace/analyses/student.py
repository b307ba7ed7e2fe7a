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
    report = _best(_each_way(runs.at(sizes), sizes, given_map, mask_means))
    if report.passed:
        report = _exposed(runs, given_map, mask_means) or report
    elif report.candidates:
        _confirm_at_a_second_size(report, runs, sizes, given_map, mask_means)
    return report


def _best(reports: list) -> StudentReport:
    return max(reports, key=lambda r: (r.passed, r.first_wrong.index if r.first_wrong else 1e9,
                                       -r.output_diff))


def _exposed(runs, given_map, mask_means) -> StudentReport | None:
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
            raise MhaError(f"it is right with {was}, but with {now}: {e.message}",
                           e.exit_code, e.quantity) from None
        if not report.passed:
            report.notes.insert(0, f"it is right with {was}, but not with {now}: the check "
                                   f"tries both, and {now} shows the mistake")
            if report.candidates:
                _confirm_at_a_second_size(report, runs, sizes, given_map, mask_means)
            return report
    return None


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

    def notes(self, numpy: bool = False) -> list:
        mask = {"0-1": "its mask is read as numbers, 1 where a query may attend and 0 where not",
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
        return [n for n in (mask, fed) if n]


MASK_WAYS = {"any": ("bool", "blocked", "0-1", "additive"), "keep": ("bool", "0-1", "additive"),
             "blocked": ("blocked",)}


def _each_way(run, sizes, given_map: str | None, mask_means: str = "any",
              strided: bool = False) -> list:
    """The student's module checked the usual way and, when it is not right that way, the other
    ways a correct module may be written: a bare square matrix used as x @ W (not x @ W.T), a mask
    of numbers, one sequence rather than a batch. A way that does not run is left out; if none
    runs, the usual way's error is the one given."""
    module = run.module if run.numpy else run.module.double()
    mapping = find_projections(module, sizes.d_model, given_map) if named_weights(module) or given_map \
        else None
    turns = (False, True) if mapping is not None and square_matrices(mapping) else (False,)
    masks = ("bool",) if sizes.mask == "none" else MASK_WAYS[mask_means]
    batches = (True, False) if run.numpy else (False, True)  # NumPy: one sequence first
    usual = [Way(t, masks[0], batches[0], strided) for t in turns]
    others = [Way(t, m, u, strided) for u in batches for m in masks for t in turns
              if (m, u) != (masks[0], batches[0])]
    reports, error = [], None
    for way in usual:
        try:
            reports.append(_check_once(run, module, mapping, sizes, way))
        except MhaError as e:
            error = error or e
    if any(r.passed for r in reports):
        return reports
    for way in others:
        report = _try(run, module, mapping, sizes, way)
        if report is not None and report.passed:
            return [report]
    if not reports:
        raise error
    return _in_another_order(run, module, mapping, sizes, usual) or reports


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


def _try(run, module, mapping, sizes, way):
    try:
        return _check_once(run, module, mapping, sizes, way, explain=False)
    except MhaError:
        return None


def _check_once(run, module, mapping: Mapping | None, sizes, way: Way,
                explain: bool = True) -> StudentReport:
    from mha_trace.runs.run import make_mask
    from mha_trace.core.tracer import trace
    from mha_trace.runs.returned import split_result
    from mha_trace.runs.usermodule import forward_call

    reference, mapping, biased = _reference_for(module, mapping, sizes, way.transposed)
    one = way.unbatched
    shape = (1 if one else sizes.batch, sizes.seq, sizes.d_model)
    x = torch.randn(shape[1], shape[0], shape[2], dtype=torch.float64).transpose(0, 1) \
        if way.strided else torch.randn(shape, dtype=torch.float64)  # (T, B, D) in memory
    mask = make_mask(sizes.seq, sizes.mask)
    fed = x[0] if one else x
    fed = fed.numpy() if run.numpy else fed
    call, args, kwargs = forward_call(module, fed, _mask_as(mask, way.mask_as, run.numpy))
    if "use_projections" in inspect.signature(module.forward).parameters and mapping.layers:
        kwargs["use_projections"] = True  # the chapter's class: let it use the copied weights
        call = call[:-1] + ", use_projections=True)"
    with torch.no_grad():
        expected, expected_w = reference(x, mask=mask)
    traced = _traced_forward(run, module, args, kwargs)
    output, weights = split_result(traced.output, fed)
    report = StudentReport(run.label, mapping.describe(), call,
                           *differences(output, weights, expected, expected_w), 1e-8)
    if not report.passed and sizes.rope:
        _other_rope_convention(report, reference, x, mask, output, weights)
    if not biased:
        report.notes.append("its projections have no biases, so the reference's were set to zero")
    if mapping.stray:
        report.notes.append(f"the biases {', '.join(n for n, _ in mapping.stray)} were set to zero, "
                            f"as were the reference's: no projection's name claims them")
    if square_matrices(mapping):
        report.notes.append(f"its weight matrices are used as "
                            f"{'x @ W' if way.transposed else 'x @ W.T'} (both ways round were tried)")
    report.notes += way.notes(run.numpy)
    if not report.passed and explain:
        where_it_went_wrong(report, traced, trace(reference, x, mask=mask, keep_values=True),
                             (reference, x, mask), output, expected, module)
    return report


def _reference_for(module, mapping: Mapping | None, sizes, transposed: bool) -> tuple:
    """(the lecture's module with the student's weights, the mapping, whether biases are used).
    Without projections of its own (the chapter's split) the lecture's become the identity."""
    torch.manual_seed(sizes.seed)
    reference = MultiHeadAttention(sizes.d_model, sizes.heads, rope=sizes.rope,
                                   rope_base=sizes.rope_base).double()
    if mapping is not None:
        return reference, mapping, copy_reference(reference, mapping, module, transposed)
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


def _other_rope_convention(report, reference, x, mask, output, weights) -> None:
    """Pass a module whose RoPE turns interleaved pairs: it is the lecture's with each head's Q
    and K dims reordered (evens, then odds), which leaves every Q·Kᵀ as it is."""
    d_k, twin = reference.d_k, copy.deepcopy(reference)
    order = torch.cat([torch.arange(0, d_k, 2), torch.arange(1, d_k, 2)])
    order = torch.cat([order + h * d_k for h in range(reference.heads)])
    with torch.no_grad():
        for lin in (twin.W_q, twin.W_k):
            lin.weight.copy_(lin.weight[order])
            lin.bias.copy_(lin.bias[order])
        expected, expected_w = twin(x, mask=mask)
    diffs = differences(output, weights, expected, expected_w)
    if max(d for d in diffs if d is not None) <= report.tolerance:
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


