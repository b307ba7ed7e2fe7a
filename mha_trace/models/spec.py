"""What a training run is (`mha-trace train`): the toy tasks, the model's sizes and the
optimiser's settings, each checked in one line naming it. No torch: a run's settings are judged
before torch loads (the memory check alone asks torch how much is free)."""

from dataclasses import dataclass
from typing import Any

from mha_trace.core.validate import rope_pairs
from mha_trace.errors import MhaError

TASKS = {
    "induction": "random tokens, then the same tokens again: predict each next token of the repeat",
    "previous-token": "predict the token before the current one",
    "difference": "predict (x[t-1] - x[t-2]) mod V",
    "copy": "predict the token half a sequence back",
    "reverse": "in the second half, predict the first half backwards",
}

# per task, what trains it well on a laptop's CPU: (layers, heads, steps, learning rate)
DEFAULTS = {"induction": (2, 4, 600, 1e-3), "previous-token": (1, 4, 300, 1e-3),
            "difference": (1, 2, 1500, 3e-3), "copy": (1, 4, 600, 3e-3), "reverse": (1, 4, 600, 3e-3)}
SECONDS_PER_UNIT = 2e-9  # seconds a step per (batch · seq · layers · d_model²), 2 cores, one thread


@dataclass(frozen=True)
class Spec:
    """What a run is: the task, the model's sizes and the optimiser's settings."""

    task: str = "induction"
    layers: int = 2
    heads: int = 4
    d_model: int = 64
    vocab: int = 16
    seq: int = 32  # tokens a sequence
    batch: int = 32
    steps: int = 1000
    lr: float = 1e-3
    weight_decay: float = 0.01
    seed: int = 0
    identical_heads: bool = False
    snapshots: int = 20
    rope: bool = False  # RoPE on q and k in every layer, in place of learned positions

    @classmethod
    def of(cls, task: str = "induction", **given) -> "Spec":
        """The spec for a task, its defaults under what is given (None: the default)."""
        if not isinstance(task, str) or task not in TASKS:
            raise MhaError(f"task '{task}' is not one of {', '.join(TASKS)}", quantity="task")
        layers, heads, steps, lr = DEFAULTS[task]
        chosen: dict[str, Any] = {"layers": layers, "heads": heads, "steps": steps, "lr": lr}
        chosen.update({k: v for k, v in given.items() if v is not None})
        return cls(task=task, **chosen)

    @property
    def seconds(self) -> float:
        """About how long training takes on 2 cores."""
        return SECONDS_PER_UNIT * self.steps * self.batch * self.seq * self.layers * self.d_model ** 2 + \
            0.002 * self.steps * self.layers

    def check(self) -> None:
        """Every setting in its range, whether it came from the command line or the API (one
        line naming the setting, exit 2), then the memory the run needs (exit 1)."""
        self.check_settings()
        self._check_memory()

    def check_settings(self) -> None:
        if self.task not in TASKS:
            raise MhaError(f"task '{self.task}' is not one of {', '.join(TASKS)}", quantity="task")
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise MhaError(f"{name}={value!r} is not a whole number", quantity=name)
            if not low <= value <= high:
                raise MhaError(f"{name}={value} is outside {low}..{high}", quantity=name)
        if isinstance(self.lr, bool) or not isinstance(self.lr, (int, float)) or \
                not 1e-6 <= self.lr <= 1.0:  # nan fails both comparisons
            raise MhaError(f"lr={self.lr!r} is not a learning rate from 1e-06 to 1 (try 0.001)",
                           quantity="lr")
        if self.d_model % self.heads:
            raise MhaError(f"{self.heads} heads do not divide d_model {self.d_model}", quantity="heads")
        if self.rope:
            rope_pairs(self.d_model, self.heads)
        least = 6 if self.task == "induction" else 4  # a segment of 3 or more, then its repeat
        if self.seq < least or self.seq % 2:
            raise MhaError(f"seq {self.seq} must be even and at least {least} for {self.task} "
                           f"(the task uses its halves)", quantity="seq")

    def memory_bytes(self) -> int:
        """What a step holds at its peak: each layer's activations kept for the backward pass
        (Q, K, V, the scores and weights and their gradients), the logits, and the weights with
        AdamW's two moments and the gradients; then every snapshot's weights and probe maps."""
        B, T, D, H, L, V = self.batch, self.seq, self.d_model, self.heads, self.layers, self.vocab
        params = 2 * V * D + T * D + L * 4 * (D * D + D)
        activations = L * (8 * B * T * D + 4 * B * H * T * T) + 3 * B * T * V
        snapshots = self.snapshots * (params + L * H * 8 * T * T)
        return 4 * (activations + 4 * params + snapshots)

    def _check_memory(self) -> None:
        import torch

        from mha_trace.core.costs import human_bytes
        from mha_trace.core.runtime import available_bytes

        need, free = self.memory_bytes(), available_bytes(torch.device("cpu"))
        if free is not None and need > free:
            raise MhaError(f"this training run needs about {human_bytes(need)} (activations "
                           f"kept for the backward pass, AdamW's state, the snapshots) but only "
                           f"{human_bytes(free)} is free: a smaller --batch, --seq or --layers "
                           f"fits", exit_code=1)


# the settings' ranges, the same for the command line and the API
BOUNDS = {"layers": (1, 8), "heads": (1, 16), "d_model": (4, 512), "vocab": (2, 1000),
          "seq": (4, 256), "batch": (1, 1024), "steps": (1, 100_000), "snapshots": (2, 200),
          "seed": (0, 2 ** 64 - 1)}
