"""The Python API's plain values, each checked in one line naming its quantity, as the command
line's parser checks its options: whole numbers, names, a text, a model's head."""

from mha_trace.errors import MhaError


def whole_numbers(values, quantity: str, least: int = 1) -> list[int]:
    values = list(values) if isinstance(values, (list, tuple, set, range)) else [values]
    bad = [v for v in values if type(v) is not int or v < least]
    if bad or not values:
        raise MhaError(f"expected whole numbers of at least {least}, got {bad or values!r}",
                       quantity=quantity)
    return values


def names(values, quantity: str) -> list[str]:
    """"window,sinks" or a list of names -> the names; anything else is one line."""
    names = values.split(",") if isinstance(values, str) else list(values) \
        if isinstance(values, (list, tuple)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise MhaError(f"expected names such as 'window,sinks' or a list of them, got {values!r}",
                       quantity=quantity)
    return names


def text_of(text):
    if text is not None and not isinstance(text, str):
        raise MhaError(f"the text must be a str, got {type(text).__name__}", quantity="sentence")
    return text


def sentences_of(sentences):
    """A list of texts as a list, checked; None, a path (str or os.PathLike) as None."""
    import os

    if sentences is None or isinstance(sentences, (str, os.PathLike)):
        return None
    if not isinstance(sentences, (list, tuple)) or not sentences:
        raise MhaError(f"sentences is a list of texts or a file's path, got {sentences!r}",
                       quantity="sentences")
    return [text_of(t) for t in sentences]


def head_of(head):
    if head is None or isinstance(head, str):
        return head
    raise MhaError(f"a model's head is written 'LAYER.HEAD' as a str, e.g. '4.2' (got {head!r})",
                   quantity="head")
