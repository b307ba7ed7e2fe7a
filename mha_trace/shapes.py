"""The `shapes` analysis: build the module from sizes, trace one forward pass, summarise it."""

from dataclasses import dataclass

import torch

from mha_trace.attention import MultiHeadAttention
from mha_trace.cost import Dims
from mha_trace.errors import MhaError
from mha_trace.runtime import DTYPES, check_device, guard_memory, light_meta_kernels
from mha_trace.tracer import Failure, ForwardFailed, Step, trace
from mha_trace.validate import heads_divide, kv_heads_divide, positive


@dataclass
class ShapesRequest:
    batch: int = 2
    seq: int = 10
    d_model: int = 512
    heads: int = 8
    kv_heads: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    mask: str = "none"  # "none" | "causal"
    pad: int = 0  # mask the last `pad` key positions
    seed: int = 0
    module: str | None = None  # the user's own class, "file.py:Class"
    init: str | None = None  # its constructor arguments, "d_model=64, num_heads=4"

    def dims(self) -> Dims:
        return Dims(self.batch, self.seq, self.d_model, self.heads, self.kv_heads or self.heads,
                    self.dtype, mask=self.mask != "none" or self.pad > 0)


@dataclass
class ShapesReport:
    request: ShapesRequest
    steps: list[Step]
    parameters: dict  # per projection, from the module itself
    estimate: int  # bytes the memory guard estimated before running
    label: str = ""  # for --module: "Class from file.py"
    call: str = ""  # for --module: how forward was called
    failure: Failure | None = None  # for --module: the op that raised
    returned: str = ""  # for --module: what forward returned

    @property
    def bytes_allocated(self) -> int:
        return sum(s.bytes for s in self.steps)

    @property
    def largest(self) -> Step:
        return max(self.steps, key=lambda s: (s.bytes, -s.index))


def validate(req: ShapesRequest) -> None:
    for name in ("batch", "seq"):
        positive(name, getattr(req, name))
    if req.init is None:  # with --init the user's constructor decides what is valid
        heads_divide(req.d_model, req.heads)
    if req.kv_heads is not None:
        if req.module:
            raise MhaError("--kv-heads applies to the built-in module; with --module your class "
                           "decides its own K/V heads")
        kv_heads_divide(req.heads, req.kv_heads)
    if not 0 <= req.pad < req.seq:
        raise MhaError(f"pad={req.pad} must be at least 0 and less than seq={req.seq} "
                       f"(every query needs one key it may look at)")


def build_mask(req: ShapesRequest, device) -> torch.Tensor | None:
    """(T, T) bool, True where query i may look at key j; None when nothing is masked."""
    if req.mask == "none" and req.pad == 0:
        return None
    T = req.seq
    pos = torch.arange(T, device=device)
    keep = pos[None, :] < T - req.pad  # padding: the last `pad` keys are not real tokens
    if req.mask == "causal":
        keep = keep & (pos[None, :] <= pos[:, None])  # causal: no looking ahead
    return keep.expand(T, T)


def run_shapes(req: ShapesRequest) -> ShapesReport:
    validate(req)
    device = check_device(req.device)
    estimate = guard_memory(req.dims(), device)
    torch.manual_seed(req.seed)
    dtype, size = DTYPES[req.dtype], (req.batch, req.seq, req.d_model)
    with torch.device(device), light_meta_kernels(device):
        if req.module:
            return _run_user_module(req, device, dtype, size, estimate)
        module = MultiHeadAttention(req.d_model, req.heads, req.kv_heads).to(dtype)
        # meta tensors hold no values, so there is nothing to draw at random
        x = torch.empty(size, dtype=dtype) if device.type == "meta" else torch.randn(size, dtype=dtype)
        mask = build_mask(req, device)
        with torch.no_grad():
            result = trace(module, x, mask=mask)
    return ShapesReport(req, result.steps, _parameters(module), estimate)


def _parameters(module) -> dict:
    counts = {name: sum(p.numel() for p in layer.parameters())
              for name, layer in module.named_children()}
    own = sum(p.numel() for p in module.parameters(recurse=False))
    if own or not counts:
        counts["(own)"] = own
    return counts


def _run_user_module(req, device, dtype, size, estimate) -> ShapesReport:
    from mha_trace import usermodule

    module, source, label = usermodule.load(req.module, req.d_model, req.heads, req.init,
                                            device, dtype)
    x = torch.empty(size, dtype=dtype) if device.type == "meta" else torch.randn(size, dtype=dtype)
    mask = build_mask(req, device)
    call, args, kwargs = usermodule.forward_call(module, x, mask)
    try:
        with torch.no_grad():
            result = trace(module, *args, watch=(source,), **kwargs)
    except ForwardFailed as failed:
        return ShapesReport(req, failed.trace.steps, _parameters(module), estimate, label, call,
                            failed.trace.failure)
    output, weights = usermodule.split_result(result.output, x)
    returned = f"output {list(output.shape)}" + (
        f" and weights {list(weights.shape)}" if weights is not None else " (no weights)")
    return ShapesReport(req, result.steps, _parameters(module), estimate, label, call,
                        None, returned)
