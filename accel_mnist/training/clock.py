"""The training clock: it counts optimizer steps, never evaluation or checkpointing."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class TrainingClock:
    """Adds the time spent training to `state.train_seconds` (and the first step's to
    `state.warmup_seconds`); `sync` waits for the device, so that queued steps are counted."""

    def __init__(self, state: Any, sync: Callable[[], None]) -> None:
        self.state, self.sync = state, sync
        self._since = time.perf_counter()

    def start(self) -> None:
        """Run from now (the start of an epoch)."""
        self._since = time.perf_counter()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Stop the clock around work that is not training (evaluation, a checkpoint)."""
        self.sync()
        self.state.train_seconds += time.perf_counter() - self._since
        try:
            yield
        finally:
            self._since = time.perf_counter()

    def time_warmup(self, loss: Any, samples: int) -> None:
        """Time the first optimizer step of this process apart: torch.compile compiles there and
        optimizers allocate their state. `loss.item()` waits for the device, so it is timed whole."""
        loss.item()
        self.state.warmup_seconds += time.perf_counter() - self._since
        self.state.warmup_samples += samples
