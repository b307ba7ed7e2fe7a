"""The cost view (`mha-trace cost`, `mha_trace.cost`): parameters, FLOPs, score memory and the KV
cache of attention at any size or a model's preset, counted exactly, with main-memory traffic on
request. No torch: the numbers are formulas (`core.costs`), checked in the suite against torch's
own counts."""


def cost_view(preset: str | None = None, *args, **dims):
    """The CostReport of `core.costs.cost_report` for these options (its arguments, in its order)."""
    from mha_trace.core.costs import cost_report

    report = cost_report(preset, *args, **dims)
    import mha_trace.render.cost  # noqa: F401 (the renderers of what it returns)
    return report
