"""A student's FlashAttention forward (`verify --module FILE:Name --impl tiled`) against the lecture's
tiled walk, tile by tile: its O and logsumexp L against attention computed whole; its tile sizes
read off its first score tile; its steps against the walk's at those sizes, so that the first step
whose numbers the walk does not hold is named with its line and its tile; and its (O, L) against
each known tiled mistake."""

import math
from dataclasses import dataclass, field

import torch

from mha_trace.analyses.tiled_mistakes import FIXES, tiled_diagnoses, tiled_forward
from mha_trace.core.roles import CONSTANTS
from mha_trace.errors import MhaError
from mha_trace.records import Shows

PRODUCTS = ("matmul", "bmm", "einsum", "baddbmm", "mm")


@dataclass
class TiledReport(Shows):
    """Right or Wrong, the tile sizes found, the first wrong step and its tile, the diagnosis."""

    label: str
    causal: bool
    shape: tuple  # (B, T, d) of Q, K and V
    blocks: tuple | None  # (B_Q, B_K) read off its first score tile
    output_diff: float
    lse_diff: float | None  # None: no logsumexp found (returned, or saved for the backward)
    tolerance: float
    grad_diffs: dict = field(default_factory=dict)  # "dQ", "dK", "dV" -> max |diff|, when it has a backward
    first_wrong: object = None  # tracer.Step
    tile: tuple | None = None  # (query tile, key tile), counted from 1
    diagnosis: str | None = None
    candidates: list = field(default_factory=list)
    notes: list = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(x <= self.tolerance for x in (self.output_diff, self.lse_diff, *self.grad_diffs.values())
                   if x is not None)

    @property
    def fix(self) -> str | None:
        return FIXES.get(self.diagnosis)


def reference(Q, K, V, causal: bool) -> tuple:
    """(O, L) computed whole, in float64: softmax(Q·Kᵀ/√d)·V and each row's logsumexp."""
    S = Q.double() @ K.double().transpose(-2, -1) / math.sqrt(Q.size(-1))
    if causal:
        S = S.masked_fill(torch.ones(S.shape[-2:], dtype=torch.bool).tril().logical_not(), float("-inf"))
    return torch.softmax(S, dim=-1) @ V.double(), torch.logsumexp(S, dim=-1)


def check_tiled(call, label: str, source: str, shape: tuple, causal: bool, seed: int) -> TiledReport:
    """The student's tiled forward `call(Q, K, V, is_causal)` on seeded (B, T, d) float64 inputs."""
    g = torch.Generator().manual_seed(seed)
    Q, K, V = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    dO = torch.randn(shape, generator=g, dtype=torch.float64)
    O, L, traced, grads = _run(call, label, source, (Q, K, V), dO, causal)
    O_ref, L_ref = reference(Q, K, V, causal)
    diff = lambda a, b: float((a.double() - b).abs().max()) if a.shape == b.shape else float("inf")
    report = TiledReport(label, causal, shape, _blocks(traced.steps, shape), diff(O, O_ref),
                         None if L is None else diff(L, L_ref), 1e-8)
    if isinstance(grads, tuple):
        report.grad_diffs = dict(zip(("dQ", "dK", "dV"), map(diff, grads, _reference_grads(Q, K, V, dO, causal))))
    else:
        report.notes.append(grads)
    if L is None:
        report.notes.append("no logsumexp found (neither returned nor saved for the backward as (B, T)): "
                            "only O is compared")
    if not report.passed:
        _explain(report, traced, Q, K, V, O, L)
    return report


def _reference_grads(Q, K, V, dO, causal: bool) -> tuple:
    """dQ, dK, dV of attention computed whole, by autograd."""
    inputs = [t.clone().requires_grad_() for t in (Q, K, V)]
    q, k, v = inputs
    return torch.autograd.grad(reference(q, k, v, causal)[0], inputs, dO)


def _backward(O, inputs: list, dO) -> tuple | str:
    """Its dQ, dK, dV for dO, or in words why there are none."""
    if O.grad_fn is None:
        return "its forward keeps no graph: no backward to check"
    try:
        grads = torch.autograd.grad(O, inputs, dO, allow_unused=True)
    except NotImplementedError:
        return "its backward is not written yet (NotImplementedError): the forward alone is checked"
    missing = [n for n, g in zip(("dQ", "dK", "dV"), grads) if g is None]
    return f"its backward gives no {', '.join(missing)}" if missing else tuple(g.detach() for g in grads)


def _run(call, label: str, source: str, qkv: tuple, dO, causal: bool) -> tuple:
    """(O, L or None, its trace, its gradients or why none): L returned beside O, or saved for the
    backward (CS336's way); the gradients of its backward for dO, when it has one."""
    Q, K, V = qkv
    from mha_trace.core.tracer import ForwardFailed, trace
    from mha_trace.runs.usermodule import explain_exception, user_code

    takes = _takes_causal(call)
    if causal and not takes:
        raise MhaError(f"{label} takes no is_causal: it cannot be checked under a causal mask", quantity="mask")

    def forward(Q, K, V):  # Q, K and V by name, for the trace; is_causal as the student takes it
        return call(Q, K, V, causal) if takes else call(Q, K, V)

    try:
        with user_code(f"{label}: forward"):
            with torch.no_grad():
                traced = trace(forward, Q, K, V, watch=(source,), keep_values=True)
            inputs = [t.clone().requires_grad_() for t in (Q, K, V)]
            result = forward(*inputs)
            O = result[0] if isinstance(result, tuple) else result
            L = result[1] if isinstance(result, tuple) else _saved_lse(result, Q.shape[:2])  # before the
            grads = _backward(O, inputs, dO)  # backward frees what was saved
    except ForwardFailed as failed:
        f = failed.trace.failure
        raise MhaError(f"{label}: forward raised at line {f.line} ({f.source.strip()}): {f.message}", exit_code=1) from None
    except MhaError:
        raise
    except Exception as e:
        raise MhaError(f"{label}: forward raised {explain_exception(e)}", exit_code=1) from None
    return O.detach(), None if L is None else L.detach(), traced, grads


def _takes_causal(call) -> bool:
    import inspect

    try:
        params = list(inspect.signature(getattr(call, "__self__", None) and call.__self__.forward or call).parameters)
    except (TypeError, ValueError):
        return True
    return len([p for p in params if p != "ctx"]) >= 4


def _saved_lse(O, rows: tuple):
    """The logsumexp an autograd.Function saved for its backward: the saved tensor shaped (B, T)."""
    saved = getattr(O.grad_fn, "saved_tensors", ()) if O.grad_fn is not None else ()
    return next((t for t in saved if tuple(t.shape) == tuple(rows)), None)


def _blocks(steps, shape: tuple) -> tuple | None:
    """(B_Q, B_K): the first product of two tiles of the input, a score tile (B, B_Q, B_K)."""
    for s in steps:  # the first product of the walk is a query tile's scores against a key tile
        if s.op in PRODUCTS and len(s.shape) == 3 and s.shape[0] == shape[0] and s.from_input:
            return s.shape[1], s.shape[2]
    return None


def _explain(report: TiledReport, traced, Q, K, V, O, L) -> None:
    """The first step the walk does not hold, its tile, and the known mistakes that give (O, L)."""
    from mha_trace.core.tracer import trace

    bq, bk = report.blocks or (Q.size(1), K.size(1))
    report.candidates = tiled_diagnoses(Q, K, V, report.causal, bq, bk, O, L, atol=1e-8)
    report.diagnosis = report.candidates[0] if report.candidates else None
    with torch.no_grad():
        walk = trace(tiled_forward, Q, K, V, report.causal, bq, bk, keep_values=True)
    held = [s for s in walk.steps if s.value is not None and s.value.is_floating_point()]
    wrong = _first_wrong(traced.steps, held) or _written(traced.steps, O, L, report)
    if wrong is not None:
        report.first_wrong = wrong
        report.tile = _tile(traced.steps, wrong, Q, K, bq, bk)


FAMILIES = {**{op: "product" for op in PRODUCTS}, **{op: "scale" for op in (
    "mul", "div", "truediv", "rmul", "rdiv", "mul_", "div_", "multiply", "divide")}}


def _holds(step, held: list) -> bool:
    """Whether a step of the walk of the same kind holds these numbers: a scale by 1 holds the
    product it scaled, yet it is the scale that is wrong."""
    kind = FAMILIES.get(step.op)
    return any(v.value.shape == step.value.shape and FAMILIES.get(v.op, kind) == kind and torch.allclose(
        v.value, step.value.double(), rtol=1e-6, atol=1e-9, equal_nan=True) for v in held)


def _first_wrong(steps, held: list):
    """The student's first step computed from Q, K and V whose numbers the walk does not hold and
    from which no later step the walk holds was computed (a right step of its own is no mistake)."""
    made = CONSTANTS + ("empty_like", "new_empty", "new_zeros", "new_full")  # buffers, not computed
    checked = [s for s in steps if s.op != "input" and s.op not in made and s.from_input and s.value is not None
               and s.value.is_floating_point()]
    for n, step in enumerate(checked):
        if _holds(step, held):
            continue
        later = {step.index}
        for after in checked[n + 1:]:
            if later.intersection(after.parents):
                later.add(after.index)
                if _holds(after, held) and not _constant(after.value):  # zeros are held by anything
                    break
        else:
            return step
    return None


def _constant(t) -> bool:
    return t.numel() < 2 or bool((t == t.flatten()[0]).all())


def _written(steps, O, L, report):
    """Every step right, the result not: the last step whose numbers went into the wrong part of
    the result (O, or L when only L is wrong), as it was written."""
    target = L if L is not None and report.lse_diff > report.tolerance and report.output_diff <= report.tolerance else O
    for step in reversed(steps):
        if step.value is None or step.value.dim() != target.dim() or step.op == "input":
            continue
        rows = step.value.shape[1] if step.value.dim() > 1 else 0
        if rows and tuple(step.value.shape[2:]) == tuple(target.shape[2:]) and any(
                torch.equal(step.value, target[:, i:i + rows]) for i in range(0, target.size(1) - rows + 1, rows)):
            return step
    return None


def _tile(steps, wrong, Q, K, bq: int, bk: int) -> tuple | None:
    """(query tile, key tile) of the last slices of Q and K taken before the wrong step, from 1."""
    tiles = {}
    for s in steps:
        if s.index > wrong.index:
            break
        for name, x, size in (("q", Q, bq), ("k", K, bk)):
            if s.value is not None and len(s.shape) == 3 and s.shape[1] <= size and s.shape[2] == x.size(2):
                start = next((i for i in range(0, x.size(1), size) if s.shape[1] == min(size, x.size(1) - i)
                              and torch.equal(s.value, x[:, i:i + s.shape[1]])), None)
                if start is not None:
                    tiles[name] = start // size + 1
    return (tiles["q"], tiles.get("k")) if "q" in tiles else None
