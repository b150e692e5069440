"""The run's memory plan before `prepare`: its predicted peak, probed on the GPU (memory/plan.py), and
`batch_size: auto` settled from it on every process alike."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ..config import AUTO_BATCH, TrainConfig
from ..distributed import consensus
from ..distributed.accelerator import set_batch
from ..distributed.strategy import Strategy
from ..memory.memory_watch import setup_of, trainable_numels
from ..memory.plan import (
    CAPTURED,
    PeakPlan,
    keep_global_batch,
    plan_peak,
    planned_data_bytes,
    settle_auto_batch,
    trace_gap_line,
)
from ..memory.probe import available, probe_batches
from .averaging import resident_bytes
from .inputs import RunData
from .resolved import StepPlan
from .step import batch_loss


def plan_memory(
    accelerator: Accelerator, config: TrainConfig, strategy: Strategy, step: StepPlan, model: nn.Module,
    run_data: RunData, saved: dict[str, Any] | None,
) -> tuple[TrainConfig, PeakPlan]:  # fmt: skip
    """The config with `batch_size: auto` settled (a resumed run keeps its checkpoint's batch) and the peak's
    plan at that batch: probed on a GPU before anything else is placed there (memory/plan.py)."""
    auto = was_auto = config.batch_size == AUTO_BATCH
    if auto and saved and saved.get("batch_size"):
        if config.global_batch_size is not None:  # its accumulation too: the checkpoint's global batch
            accelerator.gradient_accumulation_steps = int(saved.get("grad_accum") or 1)
        config = _settled(accelerator, config, int(saved["batch_size"]))
        accelerator.print(f"batch size auto: {config.batch_size:,} per process, as the checkpoint was trained")
        auto = False
    refusal = CAPTURED if step.captured else None  # no probe: its number would not hold
    channels_last, smoothing = config.channels_last, config.label_smoothing

    def loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return batch_loss(m, x, y, channels_last, dtype, smoothing)

    numels, setup = trainable_numels(model), setup_of(accelerator, strategy, config)

    def agreed(choose: Callable[[], int]) -> int:
        """Every process's choice, the smallest taken; a UsageError on one process is raised on all."""
        return min(row[0] for row in consensus.gather_ints(accelerator, [consensus.agree(accelerator, choose)]))

    @functools.cache
    def examples(every: bool) -> list[torch.Tensor]:  # read from the data only where a probe runs, once
        return example_draws(run_data.train, config.seed, every)

    shape = tuple(run_data.train.input_shape)
    # What the run holds on the device besides the model states: the data, and ema_decay's average.
    data_bytes = planned_data_bytes(config, [run_data.train, run_data.test])
    average_bytes = resident_bytes(model, config.ema_decay)

    def probe_at(batch: int | None) -> PeakPlan:
        if refusal is not None:
            return PeakPlan().refused(refusal)
        batches = probe_batches(batch, limit=batch) if batch else None
        planned = plan_peak(accelerator, config, strategy, model, shape, data_bytes, loss, batches, examples)
        return planned.with_data_bytes(data_bytes, average_bytes)

    plan = probe_at(None)
    if auto:
        room = available(accelerator.device) if plan.inputs is not None else 0  # no prediction: no GPU to ask
        samples = len(run_data.train) // accelerator.num_processes
        most = config.max_batch_size
        plan, fits, said = settle_auto_batch(plan, numels, setup, room, samples, probe_at, agreed, most)
        batch, accelerator.gradient_accumulation_steps, kept = keep_global_batch(
            config.global_batch_size, fits, accelerator.gradient_accumulation_steps, accelerator.num_processes,
            samples, lambda choose: consensus.agree(accelerator, choose),
        )  # fmt: skip
        accelerator.print(f"{said}; {kept}; the learning rate stays {config.lr:g}")
        config = _settled(accelerator, config, batch)
    for line in (plan.note, trace_gap_line(plan, numels, setup), plan.unpredicted):
        if line:
            accelerator.print(line if line.startswith("peak memory") else f"peak memory: {line}")
    if was_auto:  # DeepSpeed's batch settings were left for this (distributed/accelerator.py)
        set_batch(accelerator, config.batch_size)
    return config, plan.at_batch(config.batch_size)


def _settled(accelerator: Accelerator, config: TrainConfig, batch: int) -> TrainConfig:
    """`config` as config.json records the run: the batch and accumulation that ran, without the bounds that
    only `auto` takes, so that `--config` of it trains the same run."""
    accumulation = int(accelerator.gradient_accumulation_steps)
    return config.replace(batch_size=batch, grad_accum=accumulation, max_batch_size=None, global_batch_size=None)


DRAW = 64  # images in one draw of the probe's examples
POOL = 512  # the images the darkest, brightest and random draws are taken from


def example_draws(train: Any, seed: int, every: bool = True) -> list[torch.Tensor]:
    """Draws of real training inputs, as the loader normalises them, for the probe to repeat to its batches, so
    that a forward that branches on its inputs' values takes their paths. The first `DRAW` images (alone where
    not `every`: the one draw a forward that runs on the meta device needs); then, from `POOL` seeded random
    images, the `DRAW` darkest, the `DRAW` brightest (by mean: a threshold on a batch's statistics falls
    between them) and two random draws."""
    first = torch.stack([train[i][0] for i in range(min(DRAW, len(train)))])
    if len(train) <= DRAW or not every:
        return [first]
    generator = torch.Generator().manual_seed(seed)
    picked = torch.randperm(len(train), generator=generator)[: min(POOL, len(train))]
    pool = torch.stack([train[int(i)][0] for i in picked])
    by_mean = pool.flatten(1).float().mean(1).argsort()
    shuffled = torch.randperm(len(pool), generator=generator)
    return [first, pool[by_mean[:DRAW]], pool[by_mean[-DRAW:]], pool[shuffled[:DRAW]], pool[shuffled[DRAW : 2 * DRAW]]]
