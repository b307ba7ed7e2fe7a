"""Where a module's weights go in its forward pass, read from the running code: each tensor
carries the set of parameters it was computed from, and the two products of attention are
found by what flows into them. The score product takes two tensors computed from forward's
input through weights (q and k; k gives its last axis), the weighted sum takes what the score
product made and one more such tensor (v), and the weights met only after the weighted sum are
the output projection's. Names play no part: a projection is what it does.

>>> flow = data_flow(module, x)          # run once under the watch
>>> flow.sides()                          # {"q": {id(W_q), ...}, "k": ..., "v": ..., "o": ...}
"""

from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode

PRODUCTS = {"matmul", "bmm", "mm", "baddbmm", "einsum", "__matmul__", "__rmatmul__"}
FUSED = {"scaled_dot_product_attention"}  # q, k, v in, the weighted sum out


@dataclass
class Product:
    left: frozenset  # the parameters the query side was computed from (ids)
    right: frozenset  # the key side's: the operand that gives the output its last axis
    output: int  # id of the output tensor
    left_id: int
    right_id: int


@dataclass
class Flow:
    sources: dict = field(default_factory=dict)  # id(tensor) -> frozenset of parameter ids
    from_input: set = field(default_factory=set)  # ids of tensors forward's input reaches
    products: list = field(default_factory=list)  # Product, in order
    fused: list = field(default_factory=list)  # (q, k, v, out) parameter sets of an SDPA call
    output: frozenset = frozenset()  # what the module's output was computed from
    descends: dict = field(default_factory=dict)  # id(tensor) -> ids of the tensors it came from
    kept: list = field(default_factory=list)  # every tensor seen, kept alive so ids stay unique

    def sides(self) -> dict:
        """{"q", "k", "v", "o"} -> the parameter ids each side of attention was computed from
        (the output's: only those met after the weighted sum); {} where the forward showed no
        attention."""
        if self.fused:
            q, k, v, out = self.fused[0]
            return {"q": q, "k": k, "v": v, "o": self.output - out}
        scores = next((p for p in self.products if self._projected(p)), None)
        later = self.products[self.products.index(scores) + 1:] if scores else []
        after = lambda i: i == scores.output or scores.output in self.descends.get(i, ())
        weighted = next((p for p in later if after(p.left_id) or after(p.right_id)), None)
        if weighted is None:
            return {}
        v = weighted.right if after(weighted.left_id) else weighted.left
        return {"q": scores.left, "k": scores.right, "v": v,
                "o": self.output - self.sources.get(weighted.output, frozenset())}

    def _projected(self, p: Product) -> bool:
        """Both operands come from forward's input through weights: q·k, not x @ W."""
        return bool(p.left and p.right) and {p.left_id, p.right_id} <= self.from_input


class _Watch(TorchFunctionMode):
    def __init__(self, flow: Flow, params: dict):
        super().__init__()
        self.flow, self.params = flow, params

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = _tensors(args) + _tensors(kwargs)
        outputs = _tensors(result)
        if not outputs:
            return result
        flow = self.flow
        came = frozenset().union(*(self._source(t) for t in inputs)) if inputs else frozenset()
        reached = any(id(t) in flow.from_input for t in inputs)
        for out in outputs:
            flow.kept.append(out)
            flow.sources[id(out)] = came
            flow.descends[id(out)] = {id(t) for t in inputs} | set().union(
                *(flow.descends.get(id(t), set()) for t in inputs))
            if reached:
                flow.from_input.add(id(out))
        name = getattr(func, "__name__", "")
        if name in PRODUCTS:
            self._product(name, args, outputs[0])
        elif name in FUSED and len(args) >= 3:
            flow.fused.append((*(self._source(t) for t in args[:3]), flow.sources[id(outputs[0])]))
        return result

    def _source(self, t) -> frozenset:
        own = frozenset({id(t)}) if id(t) in self.params else frozenset()
        return self.flow.sources.get(id(t), frozenset()) | own

    def _product(self, name: str, args: tuple, out) -> None:
        operands = _operands(name, args)
        if operands is None:
            return
        left, right = operands
        if id(left) in self.params or id(right) in self.params:
            return  # a projection (x @ W), not a product of attention
        self.flow.products.append(Product(self._source(left), self._source(right), id(out), id(left), id(right)))


def _operands(name: str, args: tuple):
    """(the query side, the key side) of a product: the right one gives the output's last axis."""
    if name == "einsum":
        equation, *tensors = args
        tensors = list(tensors[0]) if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)) else tensors
        if not isinstance(equation, str) or len(tensors) != 2 or "->" not in equation:
            return None
        ins, out = equation.replace(" ", "").split("->")
        first, _ = ins.split(",")
        return (tensors[1], tensors[0]) if out[-1:] in first and out[-1:] else tuple(tensors)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if name == "baddbmm":
        tensors = tensors[1:3]
    if name == "__rmatmul__":
        tensors = tensors[::-1]
    return tuple(tensors[:2]) if len(tensors) >= 2 else None


def _tensors(value) -> list:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def data_flow(module, args: tuple, kwargs: dict) -> Flow:
    """Run `module(*args, **kwargs)` once, watching where its parameters go."""
    flow = Flow()
    params = {id(p): p for p in list(module.parameters()) + list(module.buffers())}
    for t in _tensors(args) + _tensors(kwargs):
        flow.from_input.add(id(t))
        flow.kept.append(t)
    with torch.no_grad(), _Watch(flow, params):
        result = module(*args, **kwargs)
    first = _tensors(result)[:1]
    flow.output = flow.sources.get(id(first[0]), frozenset()) if first else frozenset()
    return flow
