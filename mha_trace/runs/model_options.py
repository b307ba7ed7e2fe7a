"""What goes with a model and what does not: a model's layer, options that describe another
source of a run, options that only a model's run has. Each refuses in one line."""

from mha_trace.errors import MhaError


def check_layer(model, layer: int) -> int:
    if not 1 <= layer <= model.layers:
        raise MhaError(f"layer {layer} is out of range ({model.name} has layers 1 to "
                       f"{model.layers})", quantity="layer")
    return layer


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

