"""Is a student's own attention module right? Copy the reference weights into it, run both on the
same input and mask, compare, and when they differ, point at the first wrong step and say why.

The reference is the lecture's MultiHeadAttention (float64). The student's four projections are
found by name (W_q / query / q_proj ..., fused c_attn / qkv / in_proj) or, failing that, by shape,
or given with --map; the mapping used is always printed.
"""

from dataclasses import replace

import torch

from mha_trace.analyses.copied import square_matrices
from mha_trace.analyses.diagnosis import suspecting
from mha_trace.analyses.projections import BY_ORDER, Mapping, find_projections, named_weights, other_orders
from mha_trace.analyses.readings import MASK_WAYS, Way, mask_ways, measured, traced_forward, try_way
from mha_trace.analyses.verdict import StudentReport, differences, where_it_went_wrong
from mha_trace.errors import MhaError


def check_student(runs, given_map: str | None = None, mask_means: str = "any") -> StudentReport:
    """The student's class against the lecture's module: `runs` is what `runs.student.resolve_student`
    made of the options (the sizes, or a config)."""
    if not isinstance(mask_means, str) or mask_means not in MASK_WAYS:
        raise MhaError(f"'{mask_means}' is not one of {', '.join(MASK_WAYS)}",
                       quantity="mask-means")
    if not isinstance(given_map, (str, type(None))):
        raise MhaError(f"map={given_map!r} is not ROLE=NAME pairs such as 'q=W_Q,k=W_K,v=W_V,o=W_O'",
                       quantity="map")
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
    traced = traced_forward(run, run.module, run.args, {} if run.numpy else dict(run.kwargs))
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
    if not sizes.rope and report.rotates:
        _right_with_rope(run, sizes, given_map, mask_means)
    if report.candidates:
        _confirm_at_a_second_size(report, runs, sizes, given_map, mask_means)
    return report


def _mask_layouts(sizes) -> list:
    """(one per sequence, one row of keys, an axis for the heads) layouts of a mask beside (T, T):
    (B, T, T), as the Annotated Transformer's mask.unsqueeze(1) takes it (a (T, T) mask there
    broadcasts wrongly, or not at all), and (B, 1, T, T), as Hugging Face's classes slice it; with
    padding alone, (B, T), as BERT's attention_mask."""
    masked = sizes.mask != "none" or sizes.pad
    return [(True, False, False), (True, False, True)] * bool(masked) + \
        [(False, True, False)] * bool(sizes.mask == "none" and sizes.pad)


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
    with suspecting(report.candidates):
        seen = {c for r in _each_way(run, second, given_map, mask_means) for c in r.candidates}
    both = [c for c in report.candidates if c in seen]
    report.diagnosis = both[0] if both else None
    if not both:
        report.notes.append(f"a known mistake gave these numbers at d_model={sizes.d_model} but "
                            f"not at {second.d_model}, so none is named")


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
    mapping = _mapped(run, module, sizes, given_map, kv_rows)
    turns = (False, True) if mapping is not None and square_matrices(mapping) else (False,)
    masks = mask_ways(run, sizes, mask_means)
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
    checked, error = [], None
    for way in usual:
        try:
            checked.append(measured(run, module, mapping, sizes, way))
        except MhaError as e:
            error = error or e
        if checked and checked[-1][0].passed:
            break  # right this way: no other reading can be more right
    reports = [r for r, _ in checked if r.passed] or [r for r, _ in checked]  # a Right reading is the verdict
    if not run.numpy and masks[0] != "own":
        others += [Way(t, m, False, strided, h, first, mask_per_sequence=per, key_padding=keys, heads_axis=four)
                   for first in (False, True) for per, keys, four in _mask_layouts(sizes) for h in layouts
                   for m in masks for t in turns]
    if not any(r.passed for r in reports):
        passed = (r for r in (try_way(run, module, mapping, sizes, way) for way in others)
                  if r is not None and r.passed)
        reports = [r for r in [next(passed, None)] if r] or reports
    if not any(r.passed for r in reports):  # only then are the usual readings the verdict's: explained
        for _, why in checked:
            why()
    if not reports:  # the usual way does not run: with one mask per sequence, or else the first
        reports = [r for r in (try_way(run, module, mapping, sizes, replace(w, mask_per_sequence=True),
                                    True) for w in usual if sizes.mask != "none" or sizes.pad) if r]
    if not reports:  # the ways that run are explained: the first that names a mistake is kept
        reports = _explained([w for w in others if not w.seq_first], run, module, mapping, sizes)
    if not reports:
        raise error
    if not any(r.passed for r in reports):
        reports = _in_another_order(run, module, mapping, sizes, usual) or _seq_first(
            run, module, mapping, sizes, others, reports)
    for r in reports:
        r.notes[:0] = grouped
    return reports


def _explained(ways: list, run, module, mapping, sizes, at_most: int = 6) -> list:
    """Of the ways the module runs (at most `at_most`, in order), the first whose explanation
    names a known mistake, else the one right the longest: a mask read in a way that runs is not
    yet the author's reading."""
    running = [w for w in ways if try_way(run, module, mapping, sizes, w) is not None][:at_most]
    explained = []
    for way in running:
        report = try_way(run, module, mapping, sizes, way, True)
        if report is not None and report.diagnosis:
            return [report]
        explained += [report] if report is not None else []
    return [_best(explained)] if explained else []


def _seq_first(run, module, mapping, sizes, others: list, reports: list) -> list:
    """A wrong module that no way explains, explained fed sequence first (T, B, d_model), its
    own layout (fairseq's, Megatron's), when that way names its mistake."""
    if run.numpy or any(r.diagnosis for r in reports):
        return reports
    tried = (try_way(run, module, mapping, sizes, w, True) for w in others if w.seq_first)
    named = next((r for r in tried if r is not None and r.diagnosis), None)
    return [named] if named else reports


def _mapped(run, module, sizes, given_map: str | None, kv_rows: int | None) -> Mapping | None:
    """The student's projections: by --map, by name or shape, else by what its forward does
    with them (one run watched, `core.flow`); None for a module without weights."""
    if not (named_weights(module) or given_map):
        return None
    try:
        named = find_projections(module, sizes.d_model, given_map, kv_rows)
    except MhaError:
        if given_map or run.numpy:
            raise
        found = _by_flow(run, module, sizes, kv_rows or sizes.d_model)
        if found is None:
            raise
        return found
    if named.how != BY_ORDER or run.numpy:
        return named
    return _by_flow(run, module, sizes, kv_rows or sizes.d_model) or named  # which is which: what each does


def _by_flow(run, module, sizes, kv_rows: int) -> Mapping | None:
    """The projections as one plain run of the student's forward shows them (None where it does
    not run, or shows no attention a weight each side)."""
    from mha_trace.analyses.projections import by_flow
    from mha_trace.analyses.readings import inputs
    from mha_trace.core.flow import data_flow
    from mha_trace.runs.usermodule import forward_call, user_code

    xs = inputs(run, (sizes.batch, sizes.seq, sizes.d_model), False)
    _, args, kwargs = forward_call(module, tuple(xs) if len(xs) == 3 else xs[0], None)
    try:
        with user_code(f"{run.label}: forward"):
            flow = data_flow(module, args, kwargs)
    except Exception:  # a forward that needs a mask, or another layout: the names' error stands
        return None
    return by_flow(flow.sides(), module, sizes.d_model, kv_rows)


NORMS = ("LayerNorm", "RMSNorm", "BatchNorm1d", "GroupNorm")
MLP_NAMES = {"mlp", "ffn", "feed_forward", "ff", "c_fc", "fc1", "fc2", "gate_proj", "up_proj",
             "down_proj"}


def _not_a_block(module, label: str, d_model: int) -> None:
    """A transformer block (norms, an MLP, residuals around attention) is refused, naming what
    it holds besides attention: it is never compared with attention alone."""
    if not isinstance(module, torch.nn.Module):
        return
    extra = [f"{name} ({type(m).__name__})" for name, m in module.named_modules()
             if type(m).__name__ in NORMS and not _qk_norm(name, m, d_model)]
    extra += [f"{name} (an MLP layer, {m.in_features} → {m.out_features})"
              for name, m in module.named_modules() if isinstance(m, torch.nn.Linear)
              and MLP_NAMES & set(name.lower().split("."))]
    if extra:
        name = label.split(" from ")[0]
        raise MhaError(f"{name} is not an attention module: besides attention it holds "
                       f"{', '.join(extra[:4])}{' and more' if len(extra) > 4 else ''}; verify "
                       f"checks one attention module (give the class its block calls for attention)",
                       quantity="module")


def _qk_norm(name: str, norm, d_model: int) -> bool:
    """A norm inside attention (QK-norm's, differential attention's per-head norm): narrower than
    d_model (a head's dims), or named for q or k (q_norm, k_ln, query_norm ...: OLMo 2's, over the
    whole projection). Its width is its normalized_shape, or a norm class of its own's gain."""
    gain = getattr(norm, "weight", None)
    shape = tuple(getattr(norm, "normalized_shape", ()) or (() if gain is None else gain.shape))
    last = name.lower().split(".")[-1]
    return (bool(shape) and shape != (d_model,)) or bool({"q", "k", "query", "key"} & set(last.split("_")))


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


def _in_another_order(run, module, mapping: Mapping | None, sizes, ways: list) -> list:
    """Four square matrices whose names say nothing, wrong in the order they were defined: each
    other order is tried. Exactly one right: that one, said. More than one, or none: the weights
    cannot be aligned (exit 2), never a wrong verdict."""
    if mapping is None or mapping.how != BY_ORDER:
        return []
    right: list = []
    for mask_as in dict.fromkeys(w.mask_as for w in ways):  # unmasked before causal by itself
        for candidate in [] if right else other_orders(mapping, module, sizes.d_model):
            passed = [r for r in (try_way(run, module, candidate, sizes, way) for way in ways
                                  if way.mask_as == mask_as) if r is not None and r.passed]
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

