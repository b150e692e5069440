"""LossTally: the same sum and non-finite runs as per-micro-batch device ops, wherever the folds fall."""

from __future__ import annotations

import math
import random

import pytest
import torch

from accel_mnist.training.loss_tally import LossTally

CPU = torch.device("cpu")


def per_step_reference(losses: list[float], accum: int, start: float) -> tuple[float, int]:
    """What the loop computed before: `loss_sum += loss` per micro-batch on the device, and
    torch.where/maximum counters per optimizer step (any micro-batch non-finite)."""
    loss_sum = torch.tensor(start)
    run = torch.zeros((), dtype=torch.int64)
    worst = torch.zeros_like(run)
    step_nonfinite = torch.zeros((), dtype=torch.bool)
    for i, value in enumerate(losses):
        loss = torch.tensor(value)
        loss_sum += loss
        step_nonfinite |= ~torch.isfinite(loss)
        if (i + 1) % accum == 0:
            run = torch.where(step_nonfinite, run + 1, 0)
            worst = torch.maximum(worst, run)
            step_nonfinite.zero_()
    return loss_sum.item(), int(worst)


def tallied(losses: list[float], accum: int, start: float, fold_at: set[int], capacity: int) -> LossTally:
    tally = LossTally(CPU, start, capacity=capacity)
    for i, value in enumerate(losses):
        tally.add(torch.tensor(value))
        if (i + 1) % accum == 0:
            tally.end_step()
        if i in fold_at:
            tally.fold()
    return tally


def some_losses(n: int, seed: int, bad: float) -> list[float]:
    rng = random.Random(seed)
    return [rng.choice([math.nan, math.inf]) if rng.random() < bad else rng.uniform(0.01, 3.0) for _ in range(n)]


@pytest.mark.parametrize("accum", [1, 3])
@pytest.mark.parametrize("bad", [0.0, 0.3, 0.7])
@pytest.mark.parametrize("capacity", [1, 4, 1024])
def test_equals_the_per_micro_batch_device_ops(accum, bad, capacity):
    losses = some_losses(120, seed=accum + int(bad * 10) + capacity, bad=bad)
    start = 12.345678  # a resumed run's saved sum: rounded to float32 as torch.tensor(start) does
    ref_sum, ref_worst = per_step_reference(losses, accum, start)
    for seed in range(5):  # folds at arbitrary places, between and inside accumulated steps
        fold_at = set(random.Random(seed).sample(range(len(losses)), k=seed * 7))
        tally = tallied(losses, accum, start, fold_at, capacity)
        total = tally.total()
        assert total.dtype == torch.float32 and total.device == CPU
        if bad == 0.0:
            assert total.item() == ref_sum  # bit for bit, not approximately
        else:
            assert math.isnan(ref_sum) or math.isinf(ref_sum)
            assert math.isnan(total.item()) == math.isnan(ref_sum)
        assert tally.worst == ref_worst


def test_a_non_finite_micro_batch_spoils_its_whole_optimizer_step():
    tally = LossTally(CPU)
    for step in range(4):  # steps 1 and 2: one micro-batch of two is NaN; a fold between them
        tally.add(torch.tensor(1.0))
        tally.fold()
        tally.add(torch.tensor(math.nan if step in (1, 2) else 1.0))
        tally.end_step()
    tally.fold()
    assert tally.worst == 2


def test_a_run_of_non_finite_steps_goes_on_across_folds_and_a_new_sum():
    tally = LossTally(CPU)
    for i in range(6):
        tally.add(torch.tensor(math.inf if i >= 2 else 0.5))
        tally.end_step()
        if i == 3:
            assert tally.total().item() == math.inf
            tally.reset_sum()
    assert tally.total().item() == math.inf and tally.worst == 4
    tally.reset_sum()
    tally.add(torch.tensor(0.25))
    tally.end_step()
    assert tally.total().item() == 0.25 and tally.worst == 4  # the longest run is kept


def test_memory_stays_bounded():
    tally = LossTally(CPU, capacity=8)
    for _ in range(100):
        tally.add(torch.tensor(1.0))
        tally.end_step()
        assert len(tally._waiting) <= 8
    assert tally.total().item() == 100.0


def test_rejects_an_empty_capacity():
    with pytest.raises(ValueError, match="capacity"):
        LossTally(CPU, capacity=0)
