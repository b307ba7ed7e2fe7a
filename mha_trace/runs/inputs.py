"""A run's inputs and weights written out at full precision (`--include-inputs`), so that anyone can
recompute it from the JSON."""

import torch
import torch.nn as nn

from mha_trace.errors import MhaError
from mha_trace.runs.run import Run


def inputs_data(run: Run) -> dict:
    """What a run was handed and its weights, at full precision, so anyone can recompute it:
    {"args": [...], "kwargs": {...}, "weights": {name: ...}} (a model's weights are not included:
    its package has them)."""
    import numpy as np

    def plain(value):
        if isinstance(value, torch.Tensor):
            if value.device.type == "meta":
                raise MhaError("include_inputs needs values, and meta tensors have none (run on "
                               "--device cpu)", quantity="include_inputs")
            return value.detach().cpu().double().tolist() if value.is_floating_point() \
                else value.detach().cpu().tolist()
        if isinstance(value, np.ndarray):
            return value.tolist()
        return None if value is None else repr(value)

    if run.sentence is not None:
        raise MhaError(f"include_inputs is for runs anyone can rebuild from the JSON; "
                       f"{run.sentence.model.name}'s weights come from its package",
                       quantity="include_inputs")
    module = run.module
    if isinstance(module, nn.Module):
        weights = {name: plain(t) for name, t in module.state_dict().items()}
    else:  # a NumPy implementation: its array attributes
        weights = {name: plain(v) for name, v in vars(module).items() if isinstance(v, np.ndarray)}
    kwargs = {name: plain(v) for name, v in run.kwargs.items() if name != "cache"}
    return {"args": [plain(a) for a in run.args], "kwargs": kwargs, "weights": weights}
