"""`verify --module FILE:Class --latent D_C`: a student's multi-head latent attention (MLA) against the
lecture's `LatentAttention`. The student's weights are taken into the lecture's module by their
shapes: W^Q; W^DKV and W^KR, fused or apart; the latent's norm; W^UK and W^UV, fused as one up-
projection (each head's key then value, as DeepSeek's kv_b_proj, or every key then every value)
or apart; W^O. Where shapes leave a choice (W^UK and W^UV are one shape when d_h = d_v), each
reading is run, and the one that computes what the student's module computes is kept. Both run on
the same input and mask; a wrong module is shown its first wrong step and, among MLA's mistakes, the
one that gives its very numbers, with its fix."""

import itertools
import math

import torch

from mha_trace.analyses.mistakes import BOTH
from mha_trace.analyses.readings import traced_forward
from mha_trace.analyses.verdict import StudentReport, differences
from mha_trace.core.attention import rope
from mha_trace.core.latent_attention import LatentAttention
from mha_trace.errors import MhaError

MISTAKES = (  # (what the student's module does, its fix, how the lecture's forward changes)
    ("the score without its RoPE part (q_C·k_C alone)", "add the RoPE part every head shares: "
     "scores = (q_C @ k_C.transpose(-2, -1) + q_R @ k_R.transpose(-2, -1)) / math.sqrt(d_h + d_R)",
     ({"rope_part": False}, {"rope_part": False, "scale": "d_h"})),
    ("scaled by √d_h, not √(d_h + d_R)", "a score is a dot product over d_h + d_R dims (its content "
     "part and its RoPE part): divide by math.sqrt(d_h + d_R)", ({"scale": "d_h"},)),
    ("the latent not normed before the up-projections", "RMS-norm c before W^UK and W^UV bring each "
     "head's key and value up from it (DeepSeek's kv_a_layernorm)", ({"normed": False},)),
    ("RoPE never turned (q_R and k_R used as projected)", "turn q_R and k_R by their positions: the "
     "RoPE part is what carries position in MLA", ({"turned": False},)),
)


def check_latent_student(runs) -> StudentReport:
    """The student's MLA class (`runs`: runs.student's, with sizes.latent) against the lecture's."""
    from mha_trace.core.tracer import trace
    from mha_trace.runs.returned import split_result
    from mha_trace.runs.run import make_mask
    from mha_trace.runs.usermodule import forward_call

    s = runs.sizes
    run = runs.at(s)
    module, x = run.module, run.x
    if not isinstance(module, torch.nn.Module):
        raise MhaError("--latent checks a torch module (nn.Module) of your own", quantity="latent")
    mask = make_mask(s.seq, s.mask, 0, "cpu")
    call, args, kwargs = forward_call(module, x, mask)
    traced = traced_forward(run, module, args, kwargs)
    output, weights = split_result(traced.output, x)
    reference, mapping, readings = _reference(module, s, x, mask, output)
    with torch.no_grad():
        expected, expected_w = reference(x, mask)
    report = StudentReport(run.label, mapping, call, *differences(output, weights, expected, expected_w), 1e-8)
    if not report.passed:
        from mha_trace.core.roles import first_wrong_step

        found, report.mapping = _diagnosed(reference, [(mapping, reference.state_dict())] + readings, x, mask, output)
        ref_trace = trace(reference, x, mask=mask, keep_values=True)
        # the step and the lecture's beside it; the jobs left after it are read for MHA's steps, not said here
        report.first_wrong, report.reference_step, _ = first_wrong_step(traced.steps, ref_trace.steps)
        report.reference_step = _same_input(report.first_wrong, report.reference_step, ref_trace.steps)
        report.candidates = [name for name, _ in found]
        report.diagnosis, report.own_fix = found[0] if found else (None, None)
    return report


def _same_input(step, paired, steps):
    """The lecture's step beside the student's first wrong one: the one paired by its job, unless it
    is the same op on an input of another shape and another step of that op took the student's (a
    fused up-projection from c beside W^UK's, not beside W^Q's that shares its output's shape)."""
    if step is None or paired is None or paired.op != step.op or paired.inputs[:1] == step.inputs[:1]:
        return paired
    return next((s for s in steps if s.op == step.op and s.inputs[:1] == step.inputs[:1]), paired)


def _diagnosed(reference, readings: list, x, mask, output) -> tuple:
    """([(name, fix)] of the mistakes that give the student's very output, the reading said): under
    the first reading of its weights (the closest) or, when none does there, under the first other
    where some do (two mistakes may come closest under a reading that is not the student's). The
    reference is left holding that reading."""
    kept = {k: v.clone() for k, v in readings[0][1].items()}
    for said, state in readings:
        reference.load_state_dict(state)
        found = [(name, fix) for name, fix, way in _mistakes() if _same(mistaken(reference, x, mask, **way), output)]
        if found:
            return found, said
    reference.load_state_dict(kept)
    return [], readings[0][0]


def _mistakes() -> list:
    """(name, fix, how the forward changes) of each of MLA's mistakes alone, then of two or more at
    once (each way a mistake may take; fewest first), as a module with several of them computes."""
    found = []
    for chosen in itertools.product(*[[None, *((name, fix, way) for way in ways)] for name, fix, ways in MISTAKES]):
        parts = [c for c in chosen if c is not None]
        way = {k: v for _, _, w in parts for k, v in w.items()}
        if parts and len(way) == sum(len(w) for _, _, w in parts):  # no step changed two ways
            found.append((BOTH.join(n for n, _, _ in parts), "; then ".join(f for _, f, _ in parts), way))
    return sorted(found, key=lambda m: m[0].count(BOTH))


def _same(mistaken, output) -> bool:
    return mistaken.shape == output.shape and torch.allclose(mistaken, output.double(), rtol=1e-6, atol=1e-9)


def _reference(module, s, x, mask, output) -> tuple:
    """(the lecture's MLA module holding the student's weights, the mapping said, every reading):
    the reading of the student's weights under which the two compute the most nearly the same."""
    d_k = s.d_model // s.heads
    reference = LatentAttention(s.d_model, s.heads, s.latent, s.rope_dim or d_k // 2).double().eval()
    best, readings = None, _readings(module, reference)
    for said, state in readings:
        reference.load_state_dict(state)
        with torch.no_grad():
            out, _ = reference(x, mask)
        diff = float((out - output.double()).abs().max()) if out.shape == output.shape else math.inf
        if best is None or diff < best[0]:
            best = (diff, said, state)
    if best is None:
        raise MhaError(_unfound(module, reference), quantity="latent", exit_code=1)
    reference.load_state_dict(best[2])
    return reference, best[1], readings


def _readings(module, m: LatentAttention) -> list:
    """Every (mapping said, state dict) the student's parameters' shapes allow, at most 32: each
    head's query read as [content; RoPE], as DeepSeek lays it out, or [RoPE; content]."""
    D, H, c, r, h, v = m.d_model, m.heads, m.kv_rank, m.rope_dim, m.nope_dim, m.v_dim
    own = {n: p.detach().double() for n, p in module.named_parameters()}
    of = lambda *shape: [n for n, p in own.items() if tuple(p.shape) == shape]
    norms = of(c) if len(of(c)) == 1 else [None]
    downs = [(n, None) for n in of(c + r, D)] + [(a, b) for a in of(c, D) for b in of(r, D)]
    ups = [(n, layout) for n in of(H * (h + v), c) for layout in ("by head", "keys first")] + [
        (a, b) for a, b in itertools.permutations(of(H * h, c) + [n for n in of(H * v, c) if h != v], 2)
        if tuple(own[a].shape) == (H * h, c) and tuple(own[b].shape) == (H * v, c)]
    readings = []
    for q, (dkv, kr), (uk, uv), o, norm, rope_first in itertools.product(
            of(H * (h + r), D), downs, ups, of(D, H * v), norms, (False, True)):
        used = [n for n in (q, dkv, kr, uk, uv, o) if n not in (None, "by head", "keys first")]
        if len(set(used)) < len(used):
            continue  # one parameter read in two roles
        W_uk, W_uv = _up(own, uk, uv, H, h, v, c)
        W_q = own[q].view(H, h + r, D).roll(-r, dims=1).reshape(H * (h + r), D) if rope_first else own[q]
        state = {"W_q.weight": W_q, "W_dkv.weight": own[dkv] if kr is None else torch.cat([own[dkv], own[kr]]),
                 "kv_norm.weight": own[norm] if norm else torch.ones(c, dtype=torch.float64),
                 "W_uk.weight": W_uk, "W_uv.weight": W_uv, "W_o.weight": own[o]}
        down = dkv if kr is None else f"{dkv} and {kr}"
        up = f"{uk} ({uv})" if uv in ("by head", "keys first") else f"{uk}, {uv}"
        q = f"{q} (each head's RoPE part first)" if rope_first else q
        readings.append((f"q={q}, down to c and k_R={down}, norm={norm or 'none'}, up to k and v={up}, o={o} "
                         f"(by shape and by what they compute)", state))
    return readings[:32]


def _up(own, uk, uv, H, h, v, c) -> tuple:
    """W^UK (H·d_h, d_c) and W^UV (H·d_v, d_c) from the student's: apart, or one fused matrix laid
    out head by head ([k; v] each head, DeepSeek's kv_b_proj) or every key then every value."""
    if uv == "by head":
        k, vv = own[uk].view(H, h + v, c).split([h, v], dim=1)
        return k.reshape(H * h, c), vv.reshape(H * v, c)
    if uv == "keys first":
        return own[uk][:H * h], own[uk][H * h:]
    return own[uk], own[uv]


def _unfound(module, m: LatentAttention) -> str:
    shapes = ", ".join(f"{n} {list(p.shape)}" for n, p in module.named_parameters())
    return (f"{type(module).__name__} has no weights of MLA's shapes at d_model={m.d_model}, heads={m.heads}, "
            f"d_c={m.kv_rank}, d_R={m.rope_dim} (W^Q [{m.heads * (m.nope_dim + m.rope_dim)}, {m.d_model}], "
            f"W^DKV [{m.kv_rank + m.rope_dim}, {m.d_model}] or W^DKV and W^KR apart, W^UK and W^UV "
            f"[{m.heads * m.nope_dim}, {m.kv_rank}] each or fused, W^O [{m.d_model}, {m.heads * m.v_dim}]); "
            f"it has {shapes}")


def mistaken(m: LatentAttention, x, mask, rope_part=True, scale=None, normed=True, turned=True):
    """The lecture's MLA (its naive form) with one step done as a mistake does it: the output."""
    B, T, H = x.size(0), x.size(1), m.heads
    with torch.no_grad():
        q = m.W_q(x).view(B, T, H, m.nope_dim + m.rope_dim).transpose(1, 2)
        q_c, q_r = q.split([m.nope_dim, m.rope_dim], dim=-1)
        c, k_r = m.W_dkv(x).split([m.kv_rank, m.rope_dim], dim=-1)
        c, k_r = m.kv_norm(c) if normed else c, k_r[:, None]
        if turned:
            q_r, k_r = rope(q_r, 0, m.rope_base), rope(k_r, 0, m.rope_base)
        scores = q_c @ m.keys(c).transpose(-2, -1) + (q_r @ k_r.transpose(-2, -1) if rope_part else 0)
        scores = scores / math.sqrt(m.nope_dim if scale == "d_h" else m.nope_dim + m.rope_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        context = torch.softmax(scores, dim=-1) @ m.values(c)
        return m.W_o(context.transpose(1, 2).reshape(B, T, H * m.v_dim))
