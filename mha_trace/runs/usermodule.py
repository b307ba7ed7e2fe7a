"""Load, build and call the user's own attention module (`--module file.py:Class`).

This runs the user's code: importing their file executes it, as `python file.py` would.
"""

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.nn as nn

from mha_trace.core.tracer import source_file
from mha_trace.errors import MhaError, printable
from mha_trace.io.files import regular_file
from mha_trace.io.streams import guard_stdout
from mha_trace.runs.contained import forget_patches, own_process, own_torch, said_warnings

D_MODEL_NAMES = ("d_model", "embed_dim", "n_embd", "dim", "hidden_size", "model_dim", "emb_dim",
                 "hidden_dim", "d", "num_hiddens", "input_dim", "query_dim", "d_in", "d_out", "emb",
                 "dim_in")  # dim_in: EECS 498's
HEADS_NAMES = ("heads", "num_heads", "n_head", "n_heads", "h", "nhead", "head_count", "num_attention_heads")
KV_HEADS_NAMES = ("kv_heads", "n_kv_heads", "num_kv_heads", "num_key_value_heads", "n_kv_head",
                  "n_query_groups", "num_groups")
HEAD_DIM_NAMES = ("d_k", "d_head", "head_dim", "dim_head", "key_dim", "head_size", "key_size")  # key_size: Haiku's
CONTEXT_NAMES = ("context_length", "block_size", "max_len", "max_seq_len", "n_positions",
                 "max_position_embeddings", "n_ctx")  # a causal buffer's size: room to spare
LATENT_NAMES = ("kv_rank", "d_c", "kv_lora_rank", "latent_dim", "d_latent", "kv_latent_dim")  # MLA's d_c
ROPE_DIM_NAMES = ("rope_dim", "d_r", "d_rope", "qk_rope_head_dim", "rope_head_dim")  # MLA's d_R
DROPOUT_NAMES = ("dropout", "p_drop", "attn_dropout", "attention_dropout", "drop", "p")
MASK_NAMES = ("mask", "attn_mask", "attention_mask", "key_padding_mask")  # the last: fairseq's, ESM's (B, T)
LENGTH_NAMES = ("valid_lens", "valid_len", "lengths")  # d2l's: how many keys of each sequence count


class UserExit(BaseException):  # not an Exception: no `except Exception` on the way swallows it
    """The user's code called sys.exit() or os._exit(): the module's doing, not the tool's."""


def explain_exception(e: BaseException) -> str:
    """'ValueError: bad shape', or for an empty message (a bare assert) the type and the line."""
    text = str(e).strip()
    if text:
        return f"{type(e).__name__}: {text.splitlines()[0]}"
    frames = traceback.extract_tb(e.__traceback__)
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} " \
            f"({frames[-1].line})" if frames else ""
    return f"{type(e).__name__}{where}"


@contextlib.contextmanager
def user_code(what: str):
    """Run the user's code: its exits become its failure, its prints go to stderr.

    `what` names the step ("importing examples/x.py", "MultiHeadAttention.forward"). A print in
    user code must never corrupt --format json, and sys.exit()/os._exit() in it must never be
    taken for the tool's own exit status.
    """
    printed = io.StringIO()
    guard_stdout()  # late prints (threads) and writes to fd 1 go to stderr, never into the output

    def no_hard_exit(code=0):
        raise UserExit(f"{what} called os._exit({code})")

    real_exit, os._exit = os._exit, no_hard_exit
    try:
        with contextlib.redirect_stdout(printed), own_torch(), own_process(), said_warnings(what):
            yield
    except SystemExit as e:
        raise MhaError(f"{printable(what)} called sys.exit({e.code!r}); the module ended itself",
                       exit_code=1) from None
    except UserExit as e:
        raise MhaError(f"{printable(str(e))}; the module ended itself", exit_code=1) from None
    except (KeyboardInterrupt, Exception):
        raise
    except BaseException as e:  # GeneratorExit and the like: the module's doing, never ours
        raise MhaError(f"{printable(what)} raised {type(e).__name__}"
                       f"{': ' + printable(str(e)) if str(e) else ''} (a BaseException that is "
                       f"not an Exception)", exit_code=1) from None
    finally:
        os._exit = real_exit
        if printed.getvalue():
            for line in printed.getvalue().rstrip("\n").splitlines():
                sys.stderr.write(f"{printable(what)} printed: {printable(line)}\n")


def _import(target: str):
    """The user's module, from FILE.py or by its importable name, run under `user_code`."""
    path = Path(target)
    if not (target.endswith(".py") or "/" in target or path.exists()):
        return _run_import(target, lambda: importlib.import_module(target))
    regular_file(path, f"module {printable(target)}", "a .py file", quantity="module")
    if path.suffix != ".py":
        raise MhaError(f"module {printable(target)}: expected a .py file", quantity="module")
    name = f"mha_trace_user_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path.resolve())
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    folder = str(path.resolve().parent)
    if folder not in sys.path:  # a sibling import works as it does under `python FILE.py`
        sys.path.insert(0, folder)
    loader = spec.loader
    return _run_import(target, lambda: loader.exec_module(module) or module)  # type: ignore[func-returns-value]


def _run_import(target: str, run):
    """Import the user's code: its exits, prints and errors handled as `user_code` does."""
    forget_patches()  # a new module: none of another module's patches
    # the student's folder gets no __pycache__ from us: reading their code leaves no trace
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True
    try:
        with user_code(f"importing {target}"):
            return run()
    except MhaError:
        raise
    except ImportError as e:
        raise MhaError(f"module {printable(target)}: cannot import it ({printable(str(e))})",
                       quantity="module") from None
    except Exception as e:
        raise MhaError(f"module {printable(target)}: importing it raised "
                       f"{printable(explain_exception(e))}", quantity="module") from None
    finally:
        sys.dont_write_bytecode = writes


def load_class(spec) -> type:
    """The class a --module SPEC names (or, from Python, the class itself)."""
    if isinstance(spec, type):
        if _runnable(spec):
            return _with_forward(spec)
        raise MhaError(f"{spec.__name__} is neither a torch.nn.Module subclass nor a class with a "
                       f"forward or __call__ method (a NumPy implementation)", quantity="module")
    if not isinstance(spec, str):
        raise MhaError(f"expected a class or 'FILE.py:Class', got {type(spec).__name__} (pass the "
                       f"class, not an instance)", quantity="module")
    if spec.startswith("example:"):
        from mha_trace.runs.bundled import example_path

        spec = example_path(spec)
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
    if not isinstance(cls, type) or not _runnable(cls):
        raise MhaError(f"module {spec}: {name} is neither a torch.nn.Module subclass nor a class "
                       f"with a forward or __call__ method (a NumPy implementation)", quantity="module")
    return _with_forward(cls)


def load_tiled(spec) -> tuple:
    """A tiled forward as CS336's assignment asks for one: a torch.autograd.Function (called through
    .apply) or a function, each called (Q, K, V, is_causal); (the callable, its label, its file)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise MhaError(f"expected 'FILE.py:Name' for --impl tiled, got {printable(str(spec))}", quantity="module")
    target, name = spec.rsplit(":", 1)
    found = getattr(_import(target), name, None)
    if isinstance(found, type) and issubclass(found, torch.autograd.Function):
        call = getattr(found, "apply")  # a torch.autograd.Function's
    elif callable(found) and not isinstance(found, type):
        call = found
    else:
        raise MhaError(f"module {printable(spec)}: {printable(name)} is not a torch.autograd.Function or a "
                       f"function (--impl tiled checks a tiled forward, called (Q, K, V, is_causal))", quantity="module")
    return call, f"{name} from {target}", source_file(found) or target


def _own_call(cls: type) -> bool:
    return any("__call__" in vars(c) for c in cls.__mro__ if c is not object)


def _runnable(cls: type) -> bool:
    return issubclass(cls, nn.Module) or callable(getattr(cls, "forward", None)) or _own_call(cls)


def _with_forward(cls: type) -> type:
    """A class called as a function (Keras' layers, NumPy classes with __call__) gets its
    __call__ as forward, the one method every check calls; anything else is as it is."""
    if issubclass(cls, nn.Module) or callable(getattr(cls, "forward", None)):
        return cls
    return type(cls.__name__, (cls,), {"forward": cls.__call__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def init_sizes(init: str | None) -> dict:
    """The width and head count an --init names ({"d_model": 16, "heads": 2} from 'num_heads=2,
    dim_in=16'), so that the check runs at the sizes the class is built with."""
    given = parse_init(init) if init else {}
    found = {}
    for size, names in (("d_model", D_MODEL_NAMES), ("heads", HEADS_NAMES)):
        value = next((v for n, v in given.items() if n in names and type(v) is int and v > 0), None)
        if value is not None:
            found[size] = value
    return found


def parse_init(text: str) -> dict:
    """'d_model=64, num_heads=4' -> {'d_model': 64, 'num_heads': 4} (Python literals only)."""
    from mha_trace.errors import printable

    fail = lambda why: MhaError(f"'{printable(text)}': expected name=value pairs such as "
                                f"'d_model=64, num_heads=4' ({why})", quantity="init")
    try:
        call = ast.parse(f"f({text})", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        raise fail(getattr(e, "msg", None) or str(e)) from None
    if not isinstance(call, ast.Call) or call.args or any(kw.arg is None for kw in call.keywords):
        raise fail("name=value pairs only")
    try:
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (ValueError, TypeError, MemoryError, RecursionError):
        raise fail("each value a Python literal: a number, a string, True, False, None, or a "
                   "list, tuple or dict of them") from None


def construct(cls: type, d_model: int, heads: int, init: str | None,
              kv_heads: int | None = None, latent: tuple = ()) -> nn.Module:
    """Build the class from (d_model, heads, kv_heads), matching its parameter names, or from
    --init. A head width (dim_head, ...) is d_model / heads wherever it has a default of its own,
    a required dropout rate 0.1 (checked in eval mode); MLA's d_c and d_R are `latent`'s."""
    sig = inspect.signature(getattr(cls, "__init__"))
    params = [p for p in list(sig.parameters.values())[1:]
              if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    shown = f"{cls.__name__}{str(sig).replace('(self, ', '(').replace('(self)', '()')}"
    if init is not None:
        kwargs = parse_init(init)
    else:
        # (names, value, given only without a default); K/V heads not given: half the query heads, grouped
        values = [(D_MODEL_NAMES, d_model, False), (HEADS_NAMES, heads, False),
                  (KV_HEADS_NAMES, kv_heads or (heads // 2 if heads % 2 == 0 else heads), not kv_heads),
                  (HEAD_DIM_NAMES, d_model // heads, False), (DROPOUT_NAMES, 0.1, True),
                  (CONTEXT_NAMES, 1024, True)] + list(zip((LATENT_NAMES, ROPE_DIM_NAMES), latent, (False, False)))
        kwargs = {p.name: value for p in params for names, value, required in values
                  if p.name in names and not (required and p.default is not p.empty)}
        if cls is nn.MultiheadAttention:
            kwargs["batch_first"] = True  # the tool's inputs are (batch, seq, d_model)
        missing = [p.name for p in params if p.default is p.empty and p.name not in kwargs]
        if missing:
            raise MhaError(f"cannot build {shown}: no value for {', '.join(map(repr, missing))} " + ("(a latent's width: "
                           "multi-head latent attention? check it with --latent D_C, e.g. --latent 16)" if set(missing) & set(
                               LATENT_NAMES) else "(give every argument with --init 'name=value, ...')"))
    try:
        sig.bind(None, **kwargs)
    except TypeError as e:
        raise MhaError(f"cannot build {shown}: {e}") from None
    try:
        with user_code(f"{cls.__name__}.__init__"):
            return cls(**kwargs)
    except MhaError:
        raise
    except Exception as e:
        raise MhaError(f"cannot build {shown} with {kwargs}: "
                       f"{printable(explain_exception(e))}") from None


def _forward_params(module) -> list:
    if not callable(getattr(module, "forward", None)):
        found = type(inspect.getattr_static(type(module), "forward", None)).__name__
        raise MhaError(f"{type(module).__name__}.forward is not a method (it is a {found}): "
                       f"define it with def forward(self, x)", quantity="module")
    return [p for p in inspect.signature(module.forward).parameters.values()
            if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def takes_mask(module) -> str | None:
    """The name of forward's mask parameter (mask, attn_mask, attention_mask, key_padding_mask, the
    first in that order, else the first other name that says mask and not padding); None if none."""
    names = [p.name for p in _forward_params(module)]
    return next((n for n in MASK_NAMES if n in names), None) or next(  # mask_attn, attn_bias_mask, ...
        (n for n in names if "mask" in n.lower() and "pad" not in n.lower()), None)


def takes_lengths(module) -> str | None:
    """forward's parameter of valid lengths (d2l's valid_lens), if it has one."""
    return next((p.name for p in _forward_params(module) if p.name in LENGTH_NAMES), None)


ROLES = {"query": 0, "queries": 0, "q": 0, "key": 1, "keys": 1, "k": 1, "value": 2, "values": 2, "v": 2}
POSITION_NAMES = ("cos", "sin", "freqs_cis", "freqs", "position_ids", "position_embeddings", "rope")


def input_names(module) -> list:
    """forward's required inputs, the mask aside: one (x) or three (q, k, v)."""
    names = [p.name for p in _forward_params(module) if p.default is p.empty
             and p.name not in MASK_NAMES + LENGTH_NAMES]
    made = [n for n in names if n.lower() in POSITION_NAMES]
    if made:
        raise MhaError(f"{type(module).__name__}.forward takes {', '.join(made)}: rotary positions "
                       f"made outside the module, which verify does not make for it (give it a "
                       f"forward that makes them, or trace it with shapes)", quantity="module")
    if len(names) not in (1, 3):
        raise MhaError(f"cannot call {type(module).__name__}.forward{inspect.signature(module.forward)}: "
                       f"expected one input (x) or three (q, k, v)")
    return names


def forward_call(module: nn.Module, x, mask: torch.Tensor | None):
    """(call description, args, kwargs) the way forward's signature asks for them.

    One required input: forward(x); three: forward(q, k, v), with x for all three, or x the
    (q, k, v) tuple. A parameter named mask / attn_mask / attention_mask gets the mask (True = may
    attend) when one is given; every other optional parameter keeps its default.
    """
    params = _forward_params(module)
    mask_param = next((p for p in params if p.name == takes_mask(module)), None)
    names = input_names(module)
    args = x if isinstance(x, tuple) and len(names) == 3 else tuple(x for _ in names)
    order = [ROLES.get(n.lower().strip("_")) for n in names]  # _K, _V, _Q as k, v, q
    if len(args) == 3 and sorted(o for o in order if o is not None) == [0, 1, 2]:
        args = tuple(args[o] for o in order)  # by name: forward(key, value, query) gets each its own
    kwargs = {}
    if mask is not None:
        if mask_param is None:
            raise MhaError(f"{type(module).__name__}.forward takes no mask argument, so no causal "
                           f"or padding mask can be applied", quantity="mask")
        # nn.MultiheadAttention's boolean attn_mask is True where attention is blocked
        kwargs[mask_param.name] = ~mask if isinstance(module, nn.MultiheadAttention) else mask
    elif mask_param is not None and mask_param.default is mask_param.empty:
        kwargs[mask_param.name] = None
    kwargs |= {p.name: None for p in params if p.name in LENGTH_NAMES and p.default is p.empty}
    shown = ", ".join(names + list(kwargs))
    return f"forward({shown})", args, kwargs


def load_user_class(spec: str, d_model: int, heads: int, init: str | None, device, dtype,
                    kv_heads: int | None = None, latent: tuple = ()) -> tuple:
    """(module, source file, label) for --module SPEC, on the device and dtype asked for."""
    cls = load_class(spec)
    where = cls.__module__ if isinstance(spec, type) else spec if spec.startswith("example:") \
        else spec.rsplit(":", 1)[0]
    with torch.device(device):
        module = construct(cls, d_model, heads, init, kv_heads, latent)
    if isinstance(module, nn.Module):
        module = module.to(dtype).eval()  # as at inference: dropout off
    source = source_file(cls) or "?"
    return module, source, f"{cls.__name__} from {where}"


def feed_config(run, config):
    """Give a module whose forward takes (Q, K, V) the config's own Q, K, V, as the chapter does.

    Its projections are switched off where forward has `use_projections` (the chapter's class),
    else set to the identity when they are all d_model × d_model, so that the heads see exactly
    the config's columns: the run so fed (a copy), its `how` saying which. A module that takes one
    input x keeps the seeded embeddings, and says so.
    """
    from dataclasses import replace

    import torch.nn as nn

    D = config.d_model
    if len(run.args) != 3:
        return replace(run, how=f"forward takes one input, so the config's separate Q, K, V "
                                f"cannot be fed; seeded embeddings of width {run.sizes.d_model}")
    if run.sizes.d_model != D:
        raise MhaError(f"d_model={run.sizes.d_model}, but the config's Q, K, V have {D} columns "
                       f"(leave --d-model out to use the config's)", quantity="d_model")
    import numpy as np

    if isinstance(run.args[0], np.ndarray):  # a NumPy implementation: unbatched (N, d_model)
        return replace(run, args=tuple(np.array(m, dtype=np.float64)
                                       for m in (config.Q, config.K, config.V)),
                       how="the config's Q, K, V as forward(Q, K, V), unbatched NumPy arrays")
    dtype, device = run.args[0].dtype, run.args[0].device
    args = tuple(torch.tensor(m, dtype=dtype, device=device)[None]
                 for m in (config.Q, config.K, config.V))
    kwargs = dict(run.kwargs)
    params = inspect.signature(run.module.forward).parameters
    if "use_projections" in params:
        how = "projections off (use_projections=False, the chapter's default)"
        kwargs.pop("use_projections", None)
    else:
        linears = [m for m in run.module.modules() if isinstance(m, nn.Linear)]
        if any(tuple(m.weight.shape) != (D, D) for m in linears):
            shapes = ", ".join(str(list(m.weight.shape)) for m in linears)
            raise MhaError(f"{run.label} projects Q, K, V with layers of shapes {shapes}, which "
                           f"cannot be set to the identity; give it a generated config instead",
                           exit_code=2, quantity="config")
        with torch.no_grad():
            for m in linears:
                m.weight.copy_(torch.eye(D, dtype=m.weight.dtype))
                if m.bias is not None:
                    m.bias.zero_()
        how = f"its {len(linears)} projections set to the identity"
    if config.W_O is not None:
        how += "; the config's W_O is not applied (a foreign module's output projection is its own)"
    return replace(run, args=args, kwargs=kwargs,
                   how=f"the config's Q, K, V as forward(Q, K, V), {how}")
