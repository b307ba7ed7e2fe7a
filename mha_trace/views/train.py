"""The train view (`mha-trace train`, `mha_trace.train`): a tiny attention-only model trained from
scratch, its heads snapshotted as they specialise; or a saved run resumed to more steps. One
request; what the settings alone decide is judged before torch."""

import os
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Union

from mha_trace.errors import MhaError

if TYPE_CHECKING:
    from mha_trace.models.training import Training


@dataclass(frozen=True)
class TrainRequest:
    task: str = "induction"
    settings: dict = field(default_factory=dict)  # the Spec's fields given (layers, heads, ...)
    resume: Union[str, os.PathLike, "Training", None] = None  # a saved run's path, or a Training
    save: str | None = None  # the path the run is saved to

    def check(self) -> None:
        """A resumed run keeps its task and sizes (only steps may be given); else the settings,
        judged before torch loads."""
        from mha_trace.models.spec import Spec

        if isinstance(self.resume, (str, os.PathLike)) and not os.fspath(self.resume).strip():
            raise MhaError("give the saved run to go on from, e.g. --resume run.pt", quantity="resume")
        changed = sorted(set(self.settings) - {"steps"}) + (["task"] if self.task != "induction" else [])
        if self.resume is not None and changed:
            raise MhaError(f"a resumed run keeps its task and sizes, so --{changed[0].replace('_', '-')} "
                           f"cannot change (give only --steps, and --save)", quantity="resume")
        if self.resume is None:
            Spec.of(self.task, **self.settings).check_settings()


def train_view(r: TrainRequest, bar=None, tell=lambda line: None, on_step=lambda loss: None):
    """The Training: every snapshot, the loss; saved when asked. `bar(total, what)` its progress
    bar (advanced with the loss), `tell(line)` a line for the person waiting (a long run),
    `on_step(loss)` after each step."""
    from mha_trace.views.source import no_bar

    r.check()
    if r.save is not None:
        from mha_trace.io.files import check_outputs

        check_outputs({"save": os.fspath(r.save)}, [])  # before a step is trained
    from mha_trace.models import checkpoints, training
    from mha_trace.models.spec import Spec
    from mha_trace.speedups import one_thread_for_models

    one_thread_for_models()
    before: Training | None = (checkpoints.read_checkpoint(os.fspath(r.resume), option="resume")
                               if isinstance(r.resume, (str, os.PathLike)) else r.resume)
    spec = Spec.of(r.task, **r.settings)
    if before is not None:
        spec = replace(before.spec, steps=r.settings.get("steps") or before.spec.steps)
        if spec.steps <= len(before.losses):
            raise MhaError(f"the run has {len(before.losses)} steps already: give more with --steps",
                           quantity="steps")
    spec.check()
    if spec.seconds > 60:
        tell(f"This run takes about {spec.seconds / 60:.0f} minutes on 2 cores.")
    with (bar or no_bar)(spec.steps - (len(before.losses) if before else 0),
                         f"training ({spec.task})") as advance:
        def step(loss: float) -> None:
            advance(f"training ({spec.task}), loss {loss:.3f}")
            on_step(loss)

        run = training.run_training(spec, step, before)
    if r.save is not None:
        checkpoints.save(run, os.fspath(r.save))
    import mha_trace.render.training  # noqa: F401 (the renderer of what it returns)
    return run
