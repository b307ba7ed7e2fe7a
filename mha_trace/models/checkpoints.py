"""A training run on disk: `save` writes a plain torch.save of tensors, numbers and strings, and
`read_checkpoint` reads one back, checking every part before it is trusted."""

import numpy as np
import torch

from mha_trace.errors import MhaError
from mha_trace.io.files import CHECKPOINT as FORMAT
from mha_trace.models.spec import Spec
from mha_trace.models.training import Snapshot, Toy, Training


def save(r: Training, path: str) -> None:
    """A plain torch.save of a dict of tensors, numbers and strings (safetensors-compatible
    tensors; torch.load(..., weights_only=True) reads it)."""
    import io

    from mha_trace.io.files import write_atomic

    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))
    snaps = [{"step": x.step, "loss": x.loss, "scores": {k: t(v) for k, v in x.scores.items()},
              "weights": t(x.weights), "state": x.state} for x in r.snapshots]
    buffer = io.BytesIO()
    torch.save({"format": FORMAT, "version": 1, "spec": dict(r.spec.__dict__), "losses": r.losses,
                "probe": r.probe, "snapshots": snaps, "state": r.state}, buffer)
    write_atomic(path, buffer.getvalue(), "save")


def read_checkpoint(path: str, option: str = "checkpoint") -> Training:
    """A run saved by `save`; one clear error for anything else, naming `option` (the flag that
    gave the path: --checkpoint or --resume)."""
    from pathlib import Path

    from mha_trace.errors import printable
    from mha_trace.io.files import regular_file

    shown = printable(path)
    regular_file(Path(path), shown, "a checkpoint from mha-trace train", option)
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 (pickle, zip and torch each raise their own)
        raise MhaError(f"{shown}: cannot read it as a checkpoint ({type(e).__name__})",
                       quantity=option) from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise MhaError(f"{shown}: is not a checkpoint from mha-trace train", quantity=option)
    problem = _problem(d)
    if problem:
        raise MhaError(f"{shown}: is a damaged checkpoint ({problem})", quantity=option)
    snaps = [Snapshot(x["step"], x["loss"], {k: v.numpy() for k, v in x["scores"].items()},
                      x["weights"].numpy(), x["state"]) for x in d["snapshots"]]
    return Training(Spec(**d["spec"]), d["losses"], snaps, d["probe"], d["state"])


def _problem(d: dict) -> str | None:
    """What makes a well-formed file of our format unusable, in words (None: nothing)."""
    spec = d.get("spec")
    if not isinstance(spec, dict) or set(spec) != set(Spec.__dataclass_fields__):
        return "its settings are missing or not mha-trace train's"
    try:
        Spec(**spec).check_settings()
    except MhaError as e:
        return f"its settings: {e.message}"
    s, snaps, state = Spec(**spec), d.get("snapshots"), d.get("state")
    if not isinstance(d.get("losses"), list) or not isinstance(d.get("probe"), list):
        return "no losses or no probe"
    if not isinstance(snaps, list) or not snaps or not all(
            isinstance(x, dict) and {"step", "loss", "scores", "weights", "state"} <= set(x)
            for x in snaps):
        return "no snapshots"
    if not isinstance(state, dict) or not {"model", "optimiser", "generator"} <= set(state):
        return "no final state to go on from"
    shapes = {k: tuple(v.shape) for k, v in Toy(s).state_dict().items()}
    for held in [x["state"] for x in snaps] + [state["model"]]:
        if not isinstance(held, dict) or {k: tuple(getattr(v, "shape", ())) for k, v in held.items()} != shapes:
            return f"weights that do not fit {s.layers} layers of {s.heads} heads, d_model {s.d_model}"
    if any(getattr(x["weights"], "shape", ())[:2] != (s.layers, s.heads) for x in snaps):
        return f"snapshot maps that are not {s.layers} layers × {s.heads} heads"
    if not all(isinstance(x["scores"], dict) and all(_numbers(v) for v in x["scores"].values())
               and _numbers(x["weights"]) for x in snaps):
        return "snapshot maps or scores that are not tensors of finite numbers"
    for held in [x["state"] for x in snaps] + [state["model"]]:
        bad = next((k for k, v in held.items() if not _numbers(v)), None)
        if bad is not None:
            return f"its weight {bad} is not a dense tensor of finite numbers (a run that diverged?)"
    return None


def _numbers(t) -> bool:
    """A dense tensor of finite floating-point numbers (not sparse, not NaN or inf)."""
    return isinstance(t, torch.Tensor) and t.layout == torch.strided and t.is_floating_point() \
        and bool(torch.isfinite(t).all())
