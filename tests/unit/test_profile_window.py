"""Which steps `--profile N` records (training/profiling.py `quiet_window`): the first N after the
first step whose spans hold no evaluation and no checkpoint."""

from __future__ import annotations

import pytest

from accel_mnist.training.cadence import Cadence
from accel_mnist.training.profiling import quiet_window


def recorded(cadence: Cadence, steps_per_epoch: int, first_step: int, steps: int) -> list[int] | None:
    """The optimizer steps after which the recorded spans open (their evaluations and checkpoints
    would be in them), as the profiler's schedule (skip_first, one warm-up span) takes them."""
    skip = quiet_window(cadence, steps_per_epoch, first_step, steps)
    return None if skip is None else list(range(first_step + skip + 1, first_step + skip + steps + 1))


@pytest.mark.parametrize("cadence, first_step, steps, want", [
    # Nothing due but the end: the first window, as before (the first span skipped, one of warm-up).
    (Cadence(total_steps=6), 0, 3, [2, 3, 4]),
    # An evaluation after step 4 would fall in spans 2..4: the window moves past it.
    (Cadence(total_steps=20, eval_every=4), 0, 3, [5, 6, 7]),
    # Checkpoints count as evaluations do; so does the end of an epoch (every 10 steps here).
    (Cadence(total_steps=30, checkpoint_every=3, eval_every=0), 0, 2, [4, 5]),
    (Cadence(total_steps=30, eval_every=0), 7, 3, [11, 12, 13]),
    # A resumed run counts from where it resumed.
    (Cadence(total_steps=40, eval_every=5), 20, 3, [22, 23, 24]),
    (Cadence(total_steps=40, eval_every=5), 20, 4, [26, 27, 28, 29]),
])  # fmt: skip
def test_the_first_window_without_an_evaluation_or_a_checkpoint(cadence, first_step, steps, want):
    got = recorded(cadence, 10, first_step, steps)
    assert got == want
    ends = {step for step in range(1, cadence.total_steps + 1) if step % 10 == 0}
    for step in got:  # nothing due after a recorded step, and the run goes on past the window
        assert not cadence.evaluate_due(step, step in ends) and not cadence.checkpoint_due(step, step in ends, False)
    assert got[-1] + 1 <= cadence.total_steps


@pytest.mark.parametrize("cadence, steps", [
    (Cadence(total_steps=30, eval_every=3), 3),  # every third step: no three in a row are quiet
    (Cadence(total_steps=4), 3),  # the run's last step would close the window: its end is in it
])  # fmt: skip
def test_no_quiet_window(cadence, steps):
    assert quiet_window(cadence, 100, 0, steps) is None
