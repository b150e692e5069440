"""When the loop checks, evaluates, checkpoints and stops: plain logic, no torch.

The loop asks after every optimizer step; each answer depends only on the step, whether an
epoch just ended and the last test accuracy, so that every rank answers alike without talking.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Cadence:
    """The schedule of one run. `*_every` of 0 means never (besides the ends of epochs and the run)."""

    total_steps: int
    log_every: int = 1
    eval_every: int = 0
    checkpoint_every: int = 0
    save_checkpoints: bool = True
    stop_at_accuracy: float | None = None

    @classmethod
    def of(cls, config: Any, steps_per_epoch: int) -> Cadence:
        """The cadence a TrainConfig asks for: its epochs of `steps_per_epoch` optimizer steps, cut at
        `max_steps` where set."""
        total_steps = steps_per_epoch * config.epochs
        return cls(
            total_steps=min(total_steps, config.max_steps) if config.max_steps else total_steps,
            log_every=config.log_every,
            eval_every=config.eval_every,
            checkpoint_every=config.checkpoint_every,
            save_checkpoints=config.save_checkpoints,
            stop_at_accuracy=config.stop_at_accuracy,
        )

    def out_of_steps(self, step: int) -> bool:
        """Whether `step` is the last step of the run (or past it)."""
        return step >= self.total_steps

    def check_due(self, step: int) -> bool:
        """Whether the ranks compare their losses and stop requests (a collective) at `step`."""
        return _every(step, self.log_every)

    def evaluate_due(self, step: int, end_of_epoch: bool) -> bool:
        """At the end of every epoch and of the run, and every `eval_every` steps."""
        return self.out_of_steps(step) or end_of_epoch or _every(step, self.eval_every)

    def finished(self, step: int, accuracy: float | None) -> bool:
        """Out of steps, or the accuracy just measured reached `stop_at_accuracy`."""
        target = math.inf if self.stop_at_accuracy is None else self.stop_at_accuracy
        return self.out_of_steps(step) or (accuracy is not None and accuracy >= target)

    def checkpoint_due(self, step: int, end_of_epoch: bool, finished: bool) -> bool:
        """At the end of every epoch and of the run, and every `checkpoint_every` steps, when saving."""
        return self.save_checkpoints and (finished or end_of_epoch or _every(step, self.checkpoint_every))


def _every(step: int, n: int) -> bool:
    return n > 0 and step % n == 0
