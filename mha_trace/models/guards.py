"""The guards every model shares, below the models themselves: which names are models, how long
a run would take and how many tokens it may hold, what a sentence and a head must look like.
Each refuses with one line before anything runs."""

from mha_trace.errors import MhaError
from mha_trace.models.registry import entry


def check_name(name: str) -> None:
    """A registered model's name, or a run saved by `mha-trace train` ("run.pt", "run.pt@600")."""
    entry(name)


def check_hearing(name: str | None, audio: str | None, attention: str | None = None) -> None:
    """A model that hears (whisper) needs --audio, and --audio (and --attention) such a model."""
    hears = name is not None and entry(name).audio
    if attention is not None and (audio is None or not hears):
        raise MhaError("--attention picks Whisper's attention: it goes with --model whisper --audio "
                       "FILE", quantity="attention")
    if audio is not None and not hears:
        raise MhaError("--audio is what Whisper hears: it goes with --model whisper", quantity="audio")
    if hears and audio is None:
        raise MhaError(f"{entry(name).title} hears audio, not text: mha-trace survey --model {name} "
                       f"--audio FILE.wav (its cross-attention heads; --timestamps for each word's "
                       f"timing; in Python: mha_trace.model(\"{name}\").hear(FILE))", quantity="audio")


LIMIT_SECONDS = 30  # the time guard: work estimated longer than this on 2 cores is refused


def seconds(model, tokens: int, copies: int = 1, passes: int = 1) -> float:
    """How long `passes` passes over `copies` copies of `tokens` tokens take on 2 cores, from
    the registry's measured cost of a pass (weights kept between passes: fixed cost once)."""
    fixed, linear, square = entry(model.key).pass_seconds
    return fixed + passes * copies * (linear * tokens + square * tokens * tokens)


def check_time(model, tokens: int, copies: int, what: str, quantity: str = "sentence") -> None:
    """The time guard: refuse work estimated over its limit, with the estimate and the longest
    sentence that fits, unless --max-seconds raises it (`quantity`: the option that sets the text)."""
    estimate, limit = seconds(model, tokens, copies), model.limits.seconds(LIMIT_SECONDS)
    if estimate <= limit:
        return
    fits = max(t for t in range(1, tokens + 1) if seconds(model, t, copies) <= limit) \
        if seconds(model, 1, copies) <= limit else 0
    raise MhaError(f"{what} runs {model.name} over {copies} copies of {tokens} tokens: about "
                   f"{estimate:.0f} s on 2 cores, and the guard stops at {limit:g} s ({fits} "
                   f"{'token fits' if fits == 1 else 'tokens fit'}); shorten the sentence, or --max-seconds {estimate + 1:.0f} goes "
                   f"on anyway", quantity=quantity)


def check_tokens(model, count: int, counted: str = "") -> None:
    """The token guard: a model's views keep every layer's weights (layers × heads × T × T), so a
    pasted page would take minutes and gigabytes. Refused before running, with what the run would
    hold and how to go on."""
    if count > model.max_positions:
        raise MhaError(f"sentence has {count} tokens{counted}; {model.name} reads at most "
                       f"{model.max_positions}", quantity="sentence")
    from mha_trace.core.costs import human_bytes

    held = 3 * model.layers * model.heads * count * count * 4  # the weights, kept three times
    limit = model.limits.tokens(model)
    if count > limit:
        raise MhaError(f"sentence has {count} tokens; every view keeps all {model.layers} × "
                       f"{model.heads} heads' T × T weights, about {human_bytes(held)} at this "
                       f"length, so the limit here is {limit} (--max-tokens {count} goes on "
                       f"anyway)", quantity="sentence")
    check_memory(model, count, held)


def check_memory(model, count: int, held: int, quantity: str = "sentence",
                 advice: str = "shorten the sentence") -> None:
    """--max-tokens lifts the token limit, never the memory guard: what the views would hold must
    fit in the memory that is free (exit 1, before the model runs)."""
    from mha_trace.core.costs import human_bytes
    from mha_trace.core.runtime import available_bytes

    free = available_bytes(model.device)
    if free is not None and held > free:
        raise MhaError(f"{count} tokens through {model.name} would hold about {human_bytes(held)} "
                       f"of attention weights, and {human_bytes(free)} is free: {advice}",
                       exit_code=1, quantity=quantity)


def check_sentence(text: str) -> str:
    """A model's text: something to run, and text (not a lone surrogate from undecodable bytes)."""
    from mha_trace.errors import printable

    if not text.strip():
        raise MhaError("sentence is empty: nothing to run", quantity="sentence")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise MhaError(f"sentence holds {printable(text[e.start])}, which is not text (bytes that "
                       f"are not UTF-8?)", quantity="sentence") from None
    return text


def parse_head(text: str, quantity: str = "head") -> tuple[int, int]:
    """'4.1' -> (4, 1): layer and head, both counted from 1, in ASCII digits."""
    import re

    found = re.fullmatch(r"([0-9]{1,9})\.([0-9]{1,9})", text) if isinstance(text, str) else None
    if found is None:
        from mha_trace.errors import printable

        raise MhaError(f"head '{printable(str(text))}' is not LAYER.HEAD, e.g. 4.1 (layer 4, head 1)",
                       quantity=quantity)
    return int(found[1]), int(found[2])
