"""Removing heads, one mechanism for configs, modules and models: a head's slice of the
concatenation is zeroed just before W_O, so the other heads and everything after run unchanged."""

import contextlib


@contextlib.contextmanager
def heads_zeroed(plan: dict):
    """While inside, each module in `plan` (the lecture's MultiHeadAttention) runs with those heads
    removed. plan: module -> [(batch rows or None for every row, head from 1)]."""
    hooks = []
    for module, targets in plan.items():
        def zero(_, args, targets=targets, d_k=module.d_k):
            concat = args[0].clone()
            for rows, h in targets:
                concat[slice(None) if rows is None else rows, ..., (h - 1) * d_k:h * d_k] = 0.0
            return (concat,)

        hooks.append(module.W_o.register_forward_pre_hook(zero))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()
