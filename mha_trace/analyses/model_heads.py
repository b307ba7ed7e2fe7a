"""A pretrained model's heads as `heads --model` and `Model.heads` show them: every head at a
glance, one layer's tables, or one head; word pieces grouped into words; [CLS]/[SEP] hidden."""

import numpy as np

from mha_trace.models.base import ModelText

from mha_trace.analyses.analysis import ModelHeads
from mha_trace.errors import MhaError


def model_heads(run, layer: int | None = None, head: str | None = None, words: bool = False,
                hide_special: bool = False, effect: bool = False) -> ModelHeads:
    """The heads of a model's run (`resolve` with a model): head "L.H", layer L, or all (the
    overview: `picked` is None); `effect`: every head's effect weights too, grouped and hidden
    as the weights are."""
    from mha_trace.core.masks import allowed
    from mha_trace.models.guards import parse_head
    from mha_trace.runs.model_options import check_heads, check_layer

    s = run.sentence
    tokens, weights = list(s.labels), s.weights
    if effect:
        from mha_trace.models.sentence import effects

        weights = np.stack([weights, effects(s.model, s.inputs, weights[None])[0]])
    if words:
        tokens, weights = word_weights(s, weights)
    if hide_special:
        keep = [i for i, t in enumerate(tokens) if t not in ("[CLS]", "[SEP]")]
        if not keep:
            raise MhaError("--hide-special leaves nothing: the sentence is only [CLS] and [SEP]",
                           quantity="hide_special")
        tokens, weights = [tokens[i] for i in keep], weights[..., keep, :][..., :, keep]
    weights, moved = (weights[0], weights[1]) if effect else (weights, None)
    if head is not None:
        picked = [parse_head(head)]
        check_heads(s.model, picked)
    elif layer is not None:
        picked = [(check_layer(s.model, layer), h) for h in range(1, s.model.heads + 1)]
    else:
        picked = None
    mask = allowed(len(tokens), "causal") if s.model.capabilities.causal else None
    return ModelHeads(tuple(tokens), weights, mask, picked=picked, effect=moved, sentence=ModelText.of(s),
                      words=words, hide_special=hide_special)


def check_not_overview(view: ModelHeads, overview: bool) -> None:
    if overview and not view.whole:
        raise MhaError("--overview shows every head; it does not go with --layer or --head")


def head_in_layer(layer: int | None, head: str | None) -> tuple[int | None, int | None]:
    """A model's --head L.H names its layer too: (the layer, the head within it, from 1); with
    --layer as well, both must name the same layer."""
    if head is None:
        return layer, None
    from mha_trace.models.guards import parse_head
    from mha_trace.runs.model_options import same_layer

    picked, only = parse_head(head)
    if picked < 1 or only < 1:
        raise MhaError(f"head {head} is out of range (layers and heads count from 1)",
                       quantity="head")
    same_layer(layer, head, picked)
    return picked, only


def model_walk(run, head: int | None, token: str | None, position: int | None,
               effect: bool = False):
    """One token of a model's run through its layer's heads (`explain --model`)."""
    from mha_trace.analyses.analysis import analyse, with_effect
    from mha_trace.runs.model_options import check_heads
    from mha_trace.analyses.walk import walk
    from mha_trace.core.picks import find_position

    s = run.sentence
    if head is not None:
        check_heads(s.model, [(run.layer, head)])
    view = with_effect(analyse(run)) if effect else analyse(run)
    return walk(view, find_position(s.tokens, token, position))


def word_weights(sentence, weights: np.ndarray) -> tuple[list, np.ndarray]:
    """Pieces grouped into words: attention to a word is the sum over its pieces (columns),
    from a word the mean over its pieces (rows), so every row still sums to 1."""
    groups, labels = list[list](), list[str]()
    for i, (tok, word) in enumerate(zip(sentence.tokens, sentence.words)):
        if word is not None and groups and sentence.words[groups[-1][0]] == word:
            groups[-1].append(i)
            labels[-1] += tok.removeprefix("##")
        else:
            groups.append([i])
            labels.append(tok)
    summed = np.stack([weights[..., g].sum(-1) for g in groups], -1)
    meaned = np.stack([summed[..., g, :].mean(-2) for g in groups], -2)
    return _distinct(labels), meaned


def _distinct(labels: list) -> list:
    return [f"{t}·{i}" if labels.count(t) > 1 else t for i, t in enumerate(labels)]
