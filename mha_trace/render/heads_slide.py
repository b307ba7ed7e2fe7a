"""The heads' slides (`heads --png`, `compare --png`): every head's weights as heatmaps; a
model's whole run as an overview beside one figure per layer."""

from mha_trace.core.head import Head
from mha_trace.analyses.analysis import Comparison, Heads, ModelHeads
from mha_trace.io.page import slide
from mha_trace.render.heatmaps import effect_panels, packed, save_heatmaps


@slide.register(Heads)
def heads_slide(view: Heads, path: str, theme: str = "light", decimals: int = 4,
                scale: float | None = None, **_) -> None:
    """A config's or a module's heads (the one asked for, else every head), each K/V group framed
    under grouped-query attention, each head beside its effect weights with --effect."""
    picked = [view.only - 1] if view.only else range(view.heads)
    name = "averaged over heads" if getattr(view, "averaged", False) else "head {}"
    panels = [(name.format(h + 1), view.tokens, view.tokens, view.weights[h], view.mask)
              for h in picked]
    groups = [view.kv_head_of(h) for h in picked] if view.kv_heads != view.heads else None
    panels, groups = effect_panels(panels, view.effect, [(0, h) for h in picked], groups)
    save_heatmaps(path, view.title, panels, decimals, theme, top=scale, groups=groups)


@slide.register(ModelHeads)
def model_heads_slide(view: ModelHeads, path: str, theme: str = "light", decimals: int = 4,
                      scale: float | None = None, **_) -> None:
    """A model's heads named L.H; with neither a layer nor a head, the overview at `path` and one
    figure per layer beside it (heads-layer01.png, ...)."""
    from mha_trace.core.masks import allowed

    tokens, model = view.tokens, view.sentence.model
    mask = allowed(len(tokens), "causal") if model.capabilities.causal else None
    if not view.whole:
        panels, _ = effect_panels([(f"head {Head(l, h)}", tokens, tokens, view.layers[l - 1, h - 1], mask)
                                   for l, h in view.picked], view.effect,
                                  [(l - 1, h - 1) for l, h in view.picked])
        save_heatmaps(path, view.title, panels, decimals, theme, top=scale)
        return
    from mha_trace.io.files import check_outputs
    from mha_trace.io.output import progress
    from mha_trace.render.heatmaps import layer_paths, save_model

    for beside in layer_paths(path, model.layers):  # the files beside it, checked before any
        check_outputs({"png": beside}, [])
    with progress(model.layers, "drawing one figure per layer") as advance:
        effect = ", effect weights" if view.effect is not None else ""
        save_model(path, view.title + effect, tokens,
                   view.layers if view.effect is None else view.effect,
                   model.capabilities.causal, decimals, theme, advance, scale)


@slide.register(Comparison)
def comparison_slide(c: Comparison, path: str, theme: str = "light", decimals: int = 4,
                     scale: float | None = None, **_) -> None:
    """Each head count's heads, a count's heads on one row where they fit."""
    panels, cols = packed([[(f"H={v.heads} head {h + 1}", v.tokens, v.tokens, v.weights[h], v.mask)
                            for h in range(v.heads)] for v in c.views])
    counts = ",".join(str(v.heads) for v in c.views)
    save_heatmaps(path, f"{c.views[0].title}: heads {counts}", panels, decimals, theme, cols=cols,
                  top=scale)
