"""Which job each step of an attention forward pass does, and the first step that does its job
wrong: a student's trace is compared with the lecture's role by role (projection, change of layout
(the head split and merge), RoPE, scores, scale, mask, softmax, weights·V, output projection),
layout included, so a mistake is named at the line that makes it.

A step's role comes from its op and where it falls: before the T × T scores everything is a
projection, a change of layout or (elementwise) RoPE; between the scores and the softmax a
division or product is the scale and a fill, `where` or sum is the mask; after the softmax a
product with the weights is weights·V; a projection after that is the output projection.
"""

import numpy as np
import torch

LAYOUT_OPS = ("view", "reshape", "contiguous", "transpose", "permute", "flatten", "swapaxes",
              "index", "getitem", "split", "chunk", "unbind", "unsqueeze", "squeeze", "copy",
              "clone", "T", "mT", "cat", "concatenate", "hstack", "stack", "unflatten")
MATMULS = ("matmul", "bmm", "mm", "einsum", "baddbmm", "dot", "tensordot", "rmatmul")
SCALES = ("div", "mul", "true_divide", "divide", "multiply", "rdiv", "rmul")
MASKS = ("masked_fill", "masked_fill_", "where", "add", "radd")
SOFTMAX = ("softmax", "_softmax", "exp", "max", "amax", "sub", "subtract", "log_softmax")
PRE_SOFTMAX = ("scores", "scale", "mask")
PARTS = ("index", "getitem", "chunk", "split", "narrow", "unbind", "select")  # a part of a tensor
IDENTITY = ("dropout", "dropout_", "feature_dropout", "alpha_dropout", "identity")
CONSTANTS = ("full", "arange", "zeros", "ones", "empty", "tensor", "linspace", "zeros_like",
             "ones_like", "full_like", "finfo")  # made, not computed from the input


def tag(steps, seq: int) -> list[str]:
    """One role per step ("input", "layout", "projection", "rope", "scores", "scale", "mask",
    "softmax", "weights·V", "output"). A loop over heads goes round again: a T × T product after
    weights·V is the next head's scores."""
    roles, phase = [], "before"
    for s in steps:
        op, square = s.op, len(s.shape) >= 2 and s.shape[-1] == s.shape[-2] == seq
        if op == "input":
            role = "input"
        elif op in IDENTITY:
            role = None  # dropout in eval mode: the value passes through, no job is done
        elif "bool" in s.dtype:
            role = None  # a mask being made
        elif phase == "softmax" and op in LAYOUT_OPS:
            role = "layout"  # V sliced for this head between the softmax and weights·V
        elif phase == "softmax" and op == "linear":
            role = "projection"  # V projected only after the softmax (a Head of its own)
        elif phase == "scores" and op in SOFTMAX or phase == "softmax" and op not in MATMULS:
            role, phase = ("mask" if op in MASKS[:3] else "softmax"), "softmax"
        elif phase == "scores" and op in SCALES + MASKS:
            role = "scale" if op in SCALES else "mask"
        elif op in LAYOUT_OPS:
            role = "layout"
        elif op in MATMULS and phase == "softmax":
            role, phase = "weights·V", "after"
        elif op in MATMULS and square and phase != "scores":
            role, phase = "scores", "scores"
        elif op in MATMULS + ("linear",):
            role = "projection" if phase == "before" else "output"
        else:
            role = "rope" if phase == "before" else None
        roles.append(role)
    return roles


def values_match(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same numbers, whatever the layout: (B, T, H, d_k) and (B, H, T, d_k) hold the same, and
    one head's slice (a NumPy class splits per head) holds part of the reference's tensor."""
    if a.numel() == 0 or b.numel() < a.numel():
        return False
    x, y = a.detach().double().flatten().sort().values, b.detach().double().flatten().sort().values
    if a.numel() == b.numel():
        return bool(torch.allclose(x, y, rtol=1e-6, atol=1e-9, equal_nan=True))
    if b.numel() % a.numel():
        return False
    found = np.isin(np.round(x.numpy(), 7), np.round(y.numpy(), 7))
    return bool(found.all())


def _holds(step, candidates) -> bool:
    """Whether one of the candidate steps holds the step's numbers: element by element where the
    shapes agree (right numbers in the wrong places are wrong), else as values, layouts aside."""
    same = [r.value for r in candidates if tuple(r.value.shape) == tuple(step.value.shape)]
    if any(torch.allclose(_masked(step.value), _masked(r), rtol=1e-6, atol=1e-9, equal_nan=True)
           for r in same):
        return True
    if same and step.op not in PARTS:
        return False
    # a part (x[..., d/2:], a chunk) may match a part the lecture's trace never shows on its own
    return any(values_match(step.value, r.value) for r in candidates
               if r.value.numel() >= step.value.numel() or step.op not in PARTS)


def _masked(t: torch.Tensor) -> torch.Tensor:
    """Scores masked with a large negative number (-1e9, torch.finfo(dtype).min) read as masked
    with -inf: the softmax gives them the same weight, zero."""
    t = t.double()
    return t.masked_fill(t <= -1e9, float("-inf")) if t.is_floating_point() else t


def holds_masked(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same masked scores, whatever large negative number did the masking."""
    return tuple(a.shape) == tuple(b.shape) and torch.allclose(_masked(a), _masked(b), rtol=1e-6,
                                                                atol=1e-9, equal_nan=True)


# a step of one role is right if it equals a lecture step of one of these (scores of a
# pre-scaled Q equal the lecture's scaled scores; a mask after the softmax leaves it as it is)
SAME_JOB = {"scores": PRE_SOFTMAX, "scale": ("scale", "mask"), "mask": ("mask",),
            "softmax": ("softmax", "mask"), "weights·V": ("weights·V",),
            "output": ("output",), "rope": ("rope",)}


def _checked(i: int, roles: list) -> bool:
    """Steps inside a role done in several ops (a softmax written by hand, RoPE's halves) are
    not compared: only the last of the run, the value the next job takes in."""
    after = [r for r in roles[i + 1:] if r is not None]
    run_goes_on = bool(after) and after[0] == roles[i]
    return not (roles[i] in ("softmax", "rope") and run_goes_on)


def _chains(steps, roles) -> list:
    """The steps between the scores and each softmax (scores, scale and mask, in any order), the
    last of each being what that softmax takes in."""
    chains, chain = [], []
    for s, role in zip(steps, roles):
        if role in PRE_SOFTMAX and s.value is not None:
            chain.append(s)
        elif role == "softmax" and chain:
            chains.append(chain)
            chain = []
    return chains


def first_wrong_step(student_steps, reference_steps) -> tuple:
    """(the student's first step that does its job differently from the lecture's module, the
    lecture's step of that job, a note or None), or (None, None, None)."""
    seq = next(s.shape[-2] for s in reference_steps if s.op == "input")
    known = [s for s in reference_steps if s.value is not None]
    ref_roles = dict(zip((s.index for s in known), tag(known, seq)))
    ref_chain = (_chains(known, [ref_roles[s.index] for s in known]) or [[]])[0]
    roles = tag(student_steps, seq)
    chains = {c[-1].index: c for c in _chains(student_steps, roles)}
    prescale = None  # the student's last scale of Q before the scores (q = q / √d_k)
    data = _from_data(student_steps)
    for i, step in enumerate(student_steps):
        role = roles[i]
        if role == "rope" and step.op in SCALES and "rope" not in ref_roles.values():
            prescale = step
        if step.index in chains and ref_chain:
            found = _chain_verdict(chains[step.index], ref_chain, roles, student_steps, ref_roles)
            if found and prescale is not None and found[0] is chains[step.index][0] \
                    and roles[student_steps.index(found[0])] == "scores":
                return prescale, found[1], found[2]  # the scores are wrong by its scale
            if found:
                return found
        if role in ("input", *PRE_SOFTMAX) or step.value is None or step.op in CONSTANTS + IDENTITY \
                or not step.from_input or step.index not in data \
                or step.value.dtype == torch.bool or step.value.is_complex() or not _checked(i, roles):
            continue
        jobs = SAME_JOB.get(role, ())
        candidates = [r for r in known if ref_roles[r.index] in jobs]
        if not candidates and role == "rope":
            continue  # elementwise work the lecture's module has no counterpart for (Q scaled early)
        if role == "projection" and _bias_next(student_steps, i, roles):
            continue  # x @ W, then + b: the sum is the projection
        if not _holds(step, candidates or known) and not _fused(step, role, known, ref_roles) \
                and not _scaled_early(step, known, ref_roles) \
                and not _vouched_for(i, student_steps, roles, known, ref_roles):
            made = _made_at(step, student_steps, roles)
            return made, counterpart(made, roles[student_steps.index(made)], known, ref_roles), None
    return None, None, None


def _made_at(step, steps, roles: list):
    """A change of layout holds what it was given: when what it was given comes, through more
    changes of layout, from a scale the lecture's module has no counterpart for (q *= scale
    before the head split), that scale is where the numbers went wrong."""
    at = {s.index: i for i, s in enumerate(steps)}
    walk = step
    while walk.op in LAYOUT_OPS and len(walk.parents) == 1 and walk.parents[0] in at:
        parent = steps[at[walk.parents[0]]]
        if roles[at[parent.index]] == "rope" and parent.op.rstrip("_") in SCALES:
            return parent
        if roles[at[parent.index]] != "layout":
            break
        walk = parent
    return step


def _from_data(steps) -> set:
    """The indices of the steps computed from forward's data (x, or q, k and v: the inputs shaped
    as the first), not from a mask alone (a mask sliced to the keys there are is no job)."""
    inputs = [s for s in steps if s.op == "input"]
    if not any(s.parents for s in steps):  # a trace that keeps no parents (NumPy's): all of it
        return {s.index for s in steps}
    data = {s.index for s in inputs if inputs and s.shape == inputs[0].shape}
    for s in steps:
        if s.op != "input" and data.intersection(s.parents):
            data.add(s.index)
    return data


def _scaled_early(step, known, ref_roles) -> bool:
    """Q scaled by 1/√d_k before the scores (CLIP's, OPT's, ESM's q * scaling), in any layout:
    its numbers are the lecture's Q's times 1/√d_k, which leaves the scores the lecture's."""
    split = [r for r in known if ref_roles[r.index] == "layout" and len(r.shape) == 4]
    if not split or step.value is None or not step.value.is_floating_point():
        return False
    scale = split[0].shape[-1] ** -0.5
    mine = step.value.double().flatten().sort().values
    return any(torch.allclose(mine, r.value.double().flatten().sort().values * scale, rtol=1e-6, atol=1e-9)
               for r in known if ref_roles[r.index] in ("projection", "layout") and r.value.numel() == mine.numel())


LATER_JOBS = ("softmax", "weights·V", "output")


def _vouched_for(i: int, steps, roles: list, known, ref_roles) -> bool:
    """A step the lecture's module has no counterpart for (Q scaled before its head split, a
    layout of its own) is right when a step computed from it does a later job exactly as the
    lecture's does: right numbers do not come from a wrong step."""
    descendants = {steps[i].index}
    for j in range(i + 1, len(steps)):
        if not descendants.intersection(steps[j].parents):
            continue
        descendants.add(steps[j].index)
        job = roles[j]
        if job in LATER_JOBS and steps[j].value is not None and _checked(j, roles) and _holds(
                steps[j], [r for r in known if ref_roles[r.index] == job]):
            return True
    return False


def _bias_next(steps, i: int, roles: list) -> bool:
    """Whether the step after a projection adds its bias (an elementwise add of the same shape)."""
    nxt = steps[i + 1] if i + 1 < len(steps) else None
    return nxt is not None and nxt.op in ("add", "radd", "add_") and nxt.shape == steps[i].shape


def _fused(step, role, known, ref_roles) -> bool:
    """A fused projection (one qkv layer): right when it holds the lecture's Q, K and V, side by
    side in any order, and so is a change of its layout before it is split ((B, T, 3, H, d_k) or
    (B, T, H, 3·d_k)); its split parts are then checked one by one."""
    if role not in ("projection", "layout"):
        return False
    parts = [r.value.flatten() for r in known if ref_roles[r.index] == "projection"]
    if not parts or role == "layout" and step.value.numel() != sum(p.numel() for p in parts):
        return False  # a layout step must hold all of Q, K and V to be the fused one's
    if role == "projection":  # q, k and v, or k and v alone (a fused to_kv): values the lecture's hold
        found = np.isin(np.round(step.value.double().flatten().numpy(), 7), np.round(torch.cat(parts).numpy(), 7))
        return step.value.numel() > parts[0].numel() and bool(found.all())
    return values_match(step.value, torch.cat(parts))


def _chain_verdict(chain, ref_chain, roles, steps, ref_roles):
    """Scores, scale and mask may come in any order; only what reaches the softmax must be the
    lecture's. When it is not: the step after the last one the lecture's chain holds, if it does
    the lecture's next job (wrongly); else that last right step, with the job left out after it."""
    role_of = {s.index: r for s, r in zip(steps, roles)}
    if _holds(chain[-1], [ref_chain[-1]]):
        return None
    matched = [(j, k) for j, s in enumerate(chain) for k, r in enumerate(ref_chain)
               if _holds(s, [r])]
    if not matched:
        return chain[0], ref_chain[0], None
    j, k = max(matched)
    nxt = ref_chain[k + 1:]
    if not nxt:  # the lecture's chain is done, and a step after it changes the scores again
        return chain[min(j + 1, len(chain) - 1)], ref_chain[-1], None
    if role_of[chain[j].index] == ref_roles[nxt[0].index] != "scores":
        return chain[j], nxt[0], None  # the job is there, done wrong (scores / 1)
    if j + 1 < len(chain) and role_of[chain[j + 1].index] == ref_roles[nxt[0].index]:
        return chain[j + 1], nxt[0], None
    done_after = {role_of[s.index] for s in chain[j + 1:]}
    left_out = [r for r in nxt if ref_roles[r.index] not in done_after] or nxt
    jobs = " and ".join(dict.fromkeys(JOB_WORDS[ref_roles[r.index]] for r in left_out))
    where = ", ".join(dict.fromkeys(f"{r.file.rsplit('/', 1)[-1]}:{r.line}" for r in left_out))
    return chain[j], left_out[0], (f"after this step the lecture's module {jobs} ({where}); "
                                   f"yours does not before the softmax")


JOB_WORDS = {"scale": "divides the scores by √d_k", "mask": "masks the scores",
             "scores": "computes the scores"}


def counterpart(step, role, reference_steps, ref_roles):
    """The lecture's step that does the student's step's job: the same role and shape; else, for
    a change of layout, the lecture's change of layout to that shape (a .reshape where the
    lecture's module has .view); else the same role; else a step of that shape."""
    same_role = [r for r in reference_steps if ref_roles[r.index] == role and r.op != "input"]
    same_shape = [r for r in reference_steps if r.shape == step.shape and r.op != "input"]
    both = [r for r in same_role if r.shape == step.shape]
    same_op = [r for r in both if r.op == step.op]
    # a step of another job is no counterpart, whatever its shape: none is shown as "—"
    return (same_op or both or same_role or (same_shape if role == "layout" else []) or [None])[0]
