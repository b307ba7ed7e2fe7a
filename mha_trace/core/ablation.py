"""Removing or scaling heads, one mechanism for configs, modules and models: each head's slice of
the concatenation is multiplied by a gate just before W_O (0 removes the head), so the other heads
and everything after run unchanged."""

import contextlib

import torch


@contextlib.contextmanager
def heads_gated(gates: dict):
    """While inside, each module in `gates` (the lecture's MultiHeadAttention) runs with head h's
    slice of the concatenation multiplied by column h of its gates. gates: module -> a function of
    the batch size giving a (B or 1, heads) tensor (it may require grad: Michel et al.'s gates)."""
    hooks = []
    for module, gate_for in gates.items():
        def scale(_, args, gate_for=gate_for, heads=module.heads, d_k=module.W_o.in_features // module.heads):
            concat = args[0]  # (B, T, heads · d_k): MLA's d_k is its d_v
            g = gate_for(concat.shape[0]).to(concat.device, concat.dtype)  # (B or 1, heads)
            split = concat.reshape(*concat.shape[:-1], heads, d_k) * g[:, None, :, None]
            return (split.reshape(concat.shape),)

        hooks.append(module.W_o.register_forward_pre_hook(scale))
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def heads_zeroed(plan: dict):
    """heads_gated with gates 0 for the removed heads, 1 for the rest. plan: module -> [(batch
    rows or None for every row, head from 1)]."""
    def zeros(targets, heads):
        def gate_for(batch):
            g = torch.ones(batch, heads)
            for rows, h in targets:
                g[slice(None) if rows is None else rows, h - 1] = 0.0
            return g
        return gate_for

    return heads_gated({module: zeros(targets, module.heads) for module, targets in plan.items()})
