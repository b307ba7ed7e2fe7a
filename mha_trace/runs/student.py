"""The student's class as `verify --module` builds it: at the sizes the options give, at any other
size the check tries, or on a config's own Q, K, V beside the lecture's module on the same."""

import functools
from dataclasses import dataclass, replace

from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions, _module_of, config_of


@dataclass(frozen=True)
class StudentRuns:
    """The student's class as `verify --module` checks it: `at(sizes)` builds it at any sizes
    (the check tries a second width, other batches and head counts); `sizes` are the first;
    on an explicit config whose Q, K, V it takes, `on_config` is (its run, the lecture's run)."""

    label: str
    sizes: object  # run.Sizes
    at: object  # Sizes -> Run
    on_config: tuple | None = None
    notes: tuple = ()


def resolve_student(o: RunOptions) -> StudentRuns:
    """The student's module (o.module) at the sizes the options give (64 wide, 4 heads, 6 tokens,
    a batch of 2 when not given, float64) or on a config: its own Q, K, V when it is explicit and
    the class takes three inputs, else the config's sizes, mask and seed."""
    from mha_trace.core.validate import check_sizes
    from mha_trace.runs.run import Sizes, from_config, from_module, module_sizes_for_config

    if o.impl not in (None, "explicit"):
        raise MhaError("--impl checks the built-in module; with --module give sizes (or --config), "
                       "--mask, --pad, --kv-heads, --rope, --window and --seed", quantity="module")
    if o.latent is not None and o.config is not None:
        raise MhaError("--latent checks your MLA class at sizes from flags, not on a config", quantity="latent")
    if o.window is not None and o.config is not None:
        raise MhaError("--window goes with sizes from flags when it checks your module", quantity="window")
    module = _module_of(o)
    at = functools.partial(from_module, module, init=o.init)
    pick = lambda value, default: default if value is None else value
    rope_base = pick(o.rope_base, 10000.0)
    if o.config is None:
        from mha_trace.runs.usermodule import init_sizes

        built = init_sizes(o.init)  # --init 'num_heads=2, dim_in=16': the check runs 16 wide
        sizes = Sizes(batch=pick(o.batch, 2), seq=pick(o.seq, 6), d_model=pick(o.d_model, built.get("d_model", 64)),
                      heads=pick(o.heads, built.get("heads", 4)), kv_heads=o.kv_heads, mask=pick(o.mask, "none"),
                      pad=pick(o.pad, 0), dtype="float64", seed=pick(o.seed, 0), rope=bool(o.rope),
                      rope_base=rope_base, rope_dim=o.rope_dim, window=o.window, scoring=o.scoring(),
                      latent=o.latent)
        check_sizes(sizes.batch, sizes.seq, sizes.d_model, None if o.init else sizes.heads,
                    sizes.kv_heads, sizes.pad)
        # the check feeds the mask itself, each way a module may take one (or none)
        return StudentRuns(module, sizes, lambda s: at(replace(s, mask="none", pad=0)))
    config, notes = config_of(replace(o, kv_heads=None, window=None)), tuple[str, ...]()
    if config.explicit:
        run = at(module_sizes_for_config(config, None, None), tokens=config.tokens, config=config)
        if len(run.args) == 3:
            return StudentRuns(run.label, None, at, (run, from_config(config)))
        notes = ("it takes one input, so it was checked on seeded input at the config's sizes "
                 "and mask, not on the config's Q, K, V",)
    elif config.pad:
        raise MhaError("a config's pad is not applied to your module by verify", quantity="config")
    sizes = Sizes(batch=1, seq=len(config.tokens), d_model=config.d_model, heads=config.heads,
                  mask=config.mask, dtype="float64", seed=config.seed, rope=config.rope,
                  rope_base=config.rope_base if config.rope else 10000.0, rope_dim=config.rope_dim,
                  scoring=config.scoring)
    return StudentRuns(module, sizes, at, None, notes)
