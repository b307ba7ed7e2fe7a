"""Load, build and call the user's own attention module (`--module file.py:Class`).

This runs the user's code: importing their file executes it, as `python file.py` would.
"""

import ast
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import torch
import torch.nn as nn

from mha_trace.errors import MhaError

D_MODEL_NAMES = ("d_model", "embed_dim", "n_embd", "dim", "hidden_size", "model_dim", "emb_dim",
                 "hidden_dim", "d")
HEADS_NAMES = ("heads", "num_heads", "n_head", "n_heads", "h", "nhead", "head_count", "num_attention_heads")
MASK_NAMES = ("mask", "attn_mask", "attention_mask")


def _import(target: str):
    path = Path(target)
    if target.endswith(".py") or "/" in target or path.exists():
        if path.is_dir():
            raise MhaError(f"module {target}: is a directory, expected a .py file", quantity="module")
        if not path.is_file():
            raise MhaError(f"module {target}: file not found", quantity="module")
        name = f"mha_trace_user_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path.resolve())
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception as e:
            raise MhaError(f"module {target}: importing it raised {type(e).__name__}: {e}", quantity="module") from None
        return module
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise MhaError(f"module {target}: cannot import it ({e})", quantity="module") from None


def load_class(spec: str) -> type:
    if ":" not in spec:
        raise MhaError(f"module {spec}: expected FILE.py:ClassName or package.module:ClassName", quantity="module")
    target, name = spec.rsplit(":", 1)
    module = _import(target)
    cls = getattr(module, name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type)
                         and issubclass(v, nn.Module) and v.__module__ == module.__name__)
        listed = ", ".join(classes) if classes else "none"
        raise MhaError(f"module {spec}: no class '{name}' in {target} "
                       f"(nn.Module classes there: {listed})", quantity="module")
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise MhaError(f"module {spec}: {name} is not a torch.nn.Module subclass", quantity="module")
    return cls


def parse_init(text: str) -> dict:
    """'d_model=64, num_heads=4' -> {'d_model': 64, 'num_heads': 4} (Python literals only)."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if call.args:
            raise ValueError("positional values")
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError) as e:
        raise MhaError(f"'{text}': expected name=value pairs such as "
                       f"'d_model=64, num_heads=4' ({e})", quantity="init") from None


def construct(cls: type, d_model: int, heads: int, init: str | None) -> nn.Module:
    """Build the class from (d_model, heads), matching its parameter names, or from --init."""
    sig = inspect.signature(cls.__init__)
    params = [p for p in list(sig.parameters.values())[1:]
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    shown = f"{cls.__name__}{str(sig).replace('(self, ', '(').replace('(self)', '()')}"
    if init is not None:
        kwargs = parse_init(init)
    else:
        kwargs = {}
        for p in params:
            if p.name in D_MODEL_NAMES:
                kwargs[p.name] = d_model
            elif p.name in HEADS_NAMES:
                kwargs[p.name] = heads
        if cls is nn.MultiheadAttention:
            kwargs["batch_first"] = True  # the tool's inputs are (batch, seq, d_model)
        missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs]
        if missing:
            raise MhaError(f"cannot build {shown}: no value for {', '.join(map(repr, missing))} "
                           f"(give every argument with --init 'name=value, ...')")
    try:
        sig.bind(None, **kwargs)
    except TypeError as e:
        raise MhaError(f"cannot build {shown}: {e}") from None
    try:
        return cls(**kwargs)
    except Exception as e:
        raise MhaError(f"cannot build {shown} with {kwargs}: {type(e).__name__}: {e}") from None


def forward_call(module: nn.Module, x: torch.Tensor, mask: torch.Tensor | None):
    """(call description, args, kwargs) the way forward's signature asks for them.

    One required input: forward(x); three: forward(q, k, v), with x for all three. A parameter
    named mask / attn_mask / attention_mask gets the mask (True = may attend) when one is given;
    every other optional parameter keeps its default.
    """
    params = [p for p in inspect.signature(module.forward).parameters.values()
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    required = [p for p in params if p.default is p.empty]
    mask_param = next((p for p in params if p.name in MASK_NAMES), None)
    names = [p.name for p in required if p.name not in MASK_NAMES]
    if len(names) not in (1, 3):
        raise MhaError(f"cannot call {type(module).__name__}.forward{inspect.signature(module.forward)}: "
                       f"expected one input (x) or three (q, k, v)")
    args = tuple(x for _ in names)
    kwargs = {}
    if mask is not None:
        if mask_param is None:
            raise MhaError(f"{type(module).__name__}.forward takes no mask argument, so no causal "
                           f"or padding mask can be applied", quantity="mask")
        # nn.MultiheadAttention's boolean attn_mask is True where attention is blocked
        kwargs[mask_param.name] = ~mask if isinstance(module, nn.MultiheadAttention) else mask
    elif mask_param is not None and mask_param.default is mask_param.empty:
        kwargs[mask_param.name] = None
    shown = ", ".join(names + list(kwargs))
    return f"forward({shown})", args, kwargs


def split_result(result, x: torch.Tensor):
    """(output, weights or None) from a tensor, (output, weights) or (weights, output)."""
    if isinstance(result, torch.Tensor):
        return result, None
    tensors = [t for t in result if isinstance(t, torch.Tensor)] if isinstance(result, (tuple, list)) else []
    if not tensors:
        raise MhaError(f"forward returned {type(result).__name__}, expected a tensor or a tuple "
                       f"of (output, weights)", exit_code=1)
    # the output keeps the input's last dim (d_model); weights end in (T, T)
    T, D = x.shape[-2], x.shape[-1]
    outputs = [t for t in tensors if t.dim() >= 2 and t.shape[-1] == D and t.shape[-2] == T]
    if len(outputs) > 1:  # T == D: prefer the one shaped like the input
        outputs = [t for t in outputs if t.dim() == x.dim()] or outputs
    output = outputs[0] if outputs else tensors[0]
    rest = [t for t in tensors if t is not output]
    return output, (rest[0] if rest else None)


def load(spec: str, d_model: int, heads: int, init: str | None, device, dtype) -> tuple:
    """(module, source file, label) for --module SPEC, on the device and dtype asked for."""
    cls = load_class(spec)
    with torch.device(device):
        module = construct(cls, d_model, heads, init)
    module = module.to(dtype)
    source = inspect.getsourcefile(cls) or "?"
    return module, source, f"{cls.__name__} from {spec.rsplit(':', 1)[0]}"
