"""What every view asks of its source the same way: the head a request names (a config's number,
a model's LAYER.HEAD), the run's inputs attached to the record (`include_inputs`), and a progress
bar that does nothing when no front end gave one."""

import contextlib

from mha_trace.errors import MhaError
from mha_trace.runs.resolve import RunOptions


def checked_picks(r) -> tuple:
    """What a request of the heads and explain views decides before torch: its source's options,
    its own clashes, the inputs asked for and the head it names. (The config, the head.)"""
    from mha_trace.runs.resolve import check_early

    config = check_early(r.source)  # before torch: a wrong flag is refused at once
    r.check()
    check_inputs(r.source, r.include_inputs)
    return config, head_pick(r.source, r.head, config)


def head_pick(o: RunOptions, head, config=None):
    """The head `head` names, checked as far as the options allow before torch: a model's "L.H"
    against the sizes its registry declares (kept as text), a config's or a module's number (an
    int, or its digits as text) against the config's heads."""
    if o.model or o.audio is not None:
        from mha_trace.runs.model_options import check_picks_early
        from mha_trace.runs.values import head_of

        head = head_of(head)
        if o.model:
            check_picks_early(o.model, o.layer, head)
        return head
    from mha_trace.core.picks import check_picks, head_number

    if isinstance(head, bool) or not isinstance(head, (int, str, type(None))):
        raise MhaError(f"head {head!r} is a whole number from 1", quantity="head")
    number = head if isinstance(head, int) else head_number(head)
    check_picks(config, [number])
    return number


def model_named(o: RunOptions) -> str:
    """The model the options name (a trained run as "run.pt@STEP" once `with_checkpoint` read it)."""
    if not o.model:
        raise MhaError("name a model, e.g. --model smollm2 (or a trained run: --checkpoint run.pt)",
                       quantity="model")
    return o.model


def model_heads_named(model, heads: str | None) -> list[tuple[int, int]]:
    """The (layer, head) pairs "L.H,L.H" names, each checked against the loaded model."""
    from mha_trace.models.guards import parse_head
    from mha_trace.runs.model_options import check_heads

    chosen = [parse_head(part.strip()) for part in (heads or "").split(",") if part.strip()]
    check_heads(model, chosen)
    return chosen


def check_inputs(o: RunOptions, include: bool) -> None:
    """include_inputs is a run anyone can rebuild: not a model's (its package has the weights)."""
    if include and (o.model or o.checkpoint):
        from mha_trace.runs.model_options import refuse_with_model

        refuse_with_model(include_inputs=True)


def attach_inputs(record, run, include: bool):
    """The record, carrying its run's inputs and weights at full precision when asked."""
    if include:
        from mha_trace.runs.inputs import inputs_data

        record.inputs = inputs_data(run)
    return record


@contextlib.contextmanager
def no_bar(total: int, what: str):
    """The progress bar of a view no front end shows one for."""
    yield lambda *_: None
