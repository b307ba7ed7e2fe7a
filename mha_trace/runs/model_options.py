"""What goes with a model and what does not: a model's layer, options that describe another
source of a run, options that only a model's run has. Each refuses in one line."""

from mha_trace.core.head import Head
from mha_trace.errors import MhaError


def check_layer(model, layer: int) -> int:
    if not 1 <= layer <= model.layers:
        raise MhaError(f"layer {layer} is out of range ({model.name} has layers 1 to "
                       f"{model.layers})", quantity="layer")
    return layer


def check_heads(model, heads: list[tuple[int, int]], quantity: str = "head") -> None:
    for layer, head in heads:
        if not 1 <= layer <= model.layers or not 1 <= head <= model.heads:
            raise MhaError(f"head {Head(layer, head)} is out of range ({model.name} has layers 1 to "
                           f"{model.layers} and heads 1 to {model.heads} in each)", quantity=quantity)


def check_picks_early(name: str, layer: int | None, heads: str | None, quantity: str = "head") -> None:
    """A model's --layer and --head L.H (comma-separated) judged against the sizes its registry
    entry declares, before torch and the weights load: a typo is answered in a fraction of a
    second. A model that declares none (a trained run) is judged once loaded."""
    from types import SimpleNamespace

    from mha_trace.models.guards import parse_head
    from mha_trace.models.registry import entry

    picked = [parse_head(part.strip(), quantity) for part in (heads or "").split(",") if part.strip()]
    if len(picked) == 1:
        same_layer(layer, heads, picked[0][0])
    card = entry(name)
    if card.size is None:
        return
    declared = SimpleNamespace(name=card.title, layers=card.size[0], heads=card.size[1])
    if layer is not None:
        check_layer(declared, layer)
    check_heads(declared, [(l, h) for l, h in picked if l >= 1 and h >= 1], quantity)  # 0: "count from 1"


def same_layer(layer: int | None, head: str, picked: int) -> None:
    """--layer beside --head L.H must name L, the head's own layer."""
    if layer is not None and layer != picked:
        raise MhaError(f"--layer {layer} and --head {head} name different layers")


def refuse_with_model(**given) -> None:
    """Options that describe another source of a run make no sense beside a model."""
    clash = [f"--{name.replace('_', '-')}" for name, value in given.items() if value is not None]
    if clash:
        raise MhaError(f"{', '.join(clash)} {'does' if len(clash) == 1 else 'do'} not go with "
                       f"--model (a pretrained model fixes its own sizes, weights and input)")


def needs_model(sentence, layer, **flags) -> None:
    """Options that only a model's run has (--prune a causal model's)."""
    for name, value in (("sentence", sentence), ("layer", layer), *flags.items()):
        if value not in (None, False):
            example = "smollm2" if name == "prune" else "minilm"
            raise MhaError(f"--{name.replace('_', '-')} goes with --model (e.g. --model {example})")

