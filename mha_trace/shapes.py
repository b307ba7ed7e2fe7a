"""The `shapes` analysis: build the module from sizes, trace one forward pass, summarise it."""

from dataclasses import dataclass

import torch

from mha_trace.attention import MultiHeadAttention
from mha_trace.cost import Dims
from mha_trace.errors import MhaError
from mha_trace.runtime import DTYPES, check_device, guard_memory, light_meta_kernels
from mha_trace.tracer import Step, trace
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

    def dims(self) -> Dims:
        return Dims(self.batch, self.seq, self.d_model, self.heads, self.kv_heads or self.heads,
                    self.dtype, mask=self.mask != "none" or self.pad > 0)


@dataclass
class ShapesReport:
    request: ShapesRequest
    steps: list[Step]
    parameters: dict  # per projection, from the module itself
    estimate: int  # bytes the memory guard estimated before running

    @property
    def bytes_allocated(self) -> int:
        return sum(s.bytes for s in self.steps)

    @property
    def largest(self) -> Step:
        return max(self.steps, key=lambda s: (s.bytes, -s.index))


def validate(req: ShapesRequest) -> None:
    for name in ("batch", "seq"):
        positive(name, getattr(req, name))
    heads_divide(req.d_model, req.heads)
    if req.kv_heads is not None:
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
        module = MultiHeadAttention(req.d_model, req.heads, req.kv_heads).to(dtype)
        # meta tensors hold no values, so there is nothing to draw at random
        x = torch.empty(size, dtype=dtype) if device.type == "meta" else torch.randn(size, dtype=dtype)
        mask = build_mask(req, device)
        with torch.no_grad():
            result = trace(module, x, mask=mask)
    params = {name: sum(p.numel() for p in layer.parameters())
              for name, layer in module.named_children()}
    return ShapesReport(req, result.steps, params, estimate)
