"""The loop's loss bookkeeping, kept off the per-micro-batch path.

Summing each loss on the device and updating the non-finite counters there would cost 12 tiny device
ops per optimizer step (`isfinite` alone is four), a kernel launch each on a GPU (measured:
docs/measurements.md#trainingloss_tallypy). Instead each micro-batch's loss is only kept (a
reference to a tensor the step made anyway: no device work), and the losses are folded into the sum
and the counts where the loop waits for the device anyway (the finite check every log_every steps,
evaluation, checkpoints), or when `capacity` of them are waiting (memory stays bounded; that fold
waits for the device).

A fold reads the waiting losses to the host in one copy and adds them one by one in float32,
in the order they came: bit for bit the sum that `loss_sum += loss` per micro-batch gives,
wherever the folds fall (a resumed run folds at other steps than an uninterrupted one).
"""

from __future__ import annotations

import numpy as np
import torch


class LossTally:
    """Per-micro-batch losses: their float32 sum, and runs of optimizer steps whose loss was not finite.

    An optimizer step counts as non-finite when the loss of any of its micro-batches was NaN or
    inf; `worst` is the longest run of consecutive such steps seen by the last fold.
    """

    def __init__(self, device: torch.device, start: float = 0.0, capacity: int = 1024) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.device, self.capacity = device, capacity
        self._sum = np.float32(start)
        self._waiting: list[torch.Tensor] = []
        self._step_ends: list[int] = []  # positions in _waiting where an optimizer step ended
        self._step_nonfinite = False  # the step still open (accumulating) had a non-finite loss
        self._run = 0  # non-finite steps in a row, up to the last one folded
        self.worst = 0

    def add(self, loss: torch.Tensor) -> None:
        """One micro-batch's loss (a 0-dim tensor); no device work unless `capacity` are waiting."""
        if len(self._waiting) == self.capacity:
            # Before the append: the newest loss stays waiting, so that the next fold still waits
            # for the device to finish its step (the loop stops its clock on that).
            self.fold()
        self._waiting.append(loss.detach())

    def end_step(self) -> None:
        """The optimizer stepped after the micro-batches added so far."""
        self._step_ends.append(len(self._waiting))

    def fold(self) -> None:
        """Fold every waiting loss into the sum and the counts; waits for the device."""
        if not self._waiting and not self._step_ends:
            return
        values = torch.stack(self._waiting).cpu().numpy() if self._waiting else np.empty(0, np.float32)
        # np.add.accumulate: each partial sum is an output, so the adds are sequential, in float32.
        self._sum = np.add.accumulate(np.concatenate([[self._sum], values]).astype(np.float32))[-1]
        finite = np.isfinite(values)
        if finite.all() and not self._step_nonfinite:  # the usual case: every step ended finite
            self._run = 0 if self._step_ends else self._run
        else:
            starts = [0, *self._step_ends]
            for start, end in zip(starts, self._step_ends, strict=False):
                self._close_step(self._step_nonfinite or not finite[start:end].all())
            self._step_nonfinite = self._step_nonfinite or not finite[starts[-1] :].all()
        self._waiting, self._step_ends = [], []

    def _close_step(self, nonfinite: bool) -> None:
        self._run = self._run + 1 if nonfinite else 0
        self.worst = max(self.worst, self._run)
        self._step_nonfinite = False

    def total(self) -> torch.Tensor:
        """The sum of every loss added since the start or the last `reset_sum()` (float32, on the device)."""
        self.fold()
        return torch.tensor(float(self._sum), dtype=torch.float32, device=self.device)

    def reset_sum(self) -> None:
        """Start a new sum (after an evaluation reported it); the non-finite counts go on."""
        self.fold()
        self._sum = np.float32(0.0)

    @staticmethod
    def rehearse(device: torch.device) -> None:
        """Add, end a step and fold once on a scratch tally: the first launches of a fold's
        kernels (stack, the copy to the host) then happen outside the training clock."""
        scratch = LossTally(device)
        scratch.add(torch.zeros((), device=device))
        scratch.end_step()
        scratch.total()
