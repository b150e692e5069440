"""The run's memory plan before `prepare`: its predicted peak, probed on the GPU (memory/plan.py), and
`batch_size: auto` settled from it on every process alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ..config import AUTO_BATCH, TrainConfig
from ..distributed import consensus
from ..distributed.accelerator import set_batch
from ..distributed.option_rules import capture_refusal
from ..distributed.strategy import Strategy
from ..errors import UsageError
from ..memory.model_states import Setup as MemorySetup
from ..memory.plan import (
    CAPTURED,
    PeakPlan,
    auto_batch,
    auto_line,
    global_batch,
    plan_peak,
    planned_data_bytes,
    trace_gap_line,
)
from ..memory.probe import available, probe_batches
from ..memory.watch import setup_of, trainable_numels
from ..optim import optimizer_class_name
from .inputs import RunData
from .step import batch_loss


def captured(strategy: Strategy, config: TrainConfig) -> bool:
    """Whether the run's step will be captured as a CUDA graph (training/step.py asks the same rule)."""
    return config.cuda_graph and capture_refusal(strategy, config, optimizer_class_name(config)) is None


def plan_memory(
    accelerator: Accelerator, config: TrainConfig, strategy: Strategy, model: nn.Module, run_data: RunData,
    saved: dict[str, Any] | None,
) -> tuple[TrainConfig, PeakPlan]:  # fmt: skip
    """The config with `batch_size: auto` settled (a resumed run keeps its checkpoint's batch) and the peak's
    plan at that batch: probed on a GPU before anything else is placed there (memory/plan.py)."""
    auto = was_auto = config.batch_size == AUTO_BATCH
    if auto and saved and saved.get("batch_size"):
        config = config.replace(batch_size=int(saved["batch_size"]))
        accelerator.print(f"batch size auto: {config.batch_size:,} per process, as the checkpoint was trained")
        auto = False
    shape = tuple(run_data.train.input_shape)
    data_bytes = planned_data_bytes(config, [run_data.train, run_data.test])
    channels_last = config.channels_last

    def loss(m: nn.Module, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return batch_loss(m, x, y, channels_last, dtype)

    # Real images, as the loader normalises them: a forward that branches on its inputs' values takes their path.
    examples = torch.stack([run_data.train[i][0] for i in range(min(64, len(run_data.train)))])
    if captured(strategy, config):  # no probe: its number would not hold (memory/plan.py, CAPTURED)
        plan = PeakPlan().refused(CAPTURED)
    else:
        plan = plan_peak(accelerator, config, strategy, model, shape, data_bytes, loss, examples=examples)
    numels, setup = trainable_numels(model), setup_of(accelerator, strategy, config)
    if auto:

        def probe_at(batch: int) -> PeakPlan:
            return plan_peak(accelerator, config, strategy, model, shape, data_bytes, loss,
                             batches=probe_batches(batch, limit=batch), examples=examples)  # fmt: skip

        config, plan = _auto_batch(accelerator, config, plan, numels, setup, len(run_data.train), probe_at)
    if was_auto:  # DeepSpeed's batch settings were left for this (distributed/accelerator.py)
        set_batch(accelerator, config.batch_size)
    for said in (plan.note, trace_gap_line(plan, numels, setup), plan.unpredicted):
        if said:
            accelerator.print(said if said.startswith("peak memory") else f"peak memory: {said}")
    return config, plan.at_batch(config.batch_size)


def _auto_batch(
    accelerator: Accelerator, config: TrainConfig, plan: PeakPlan, numels: list[int], setup: MemorySetup,
    train_samples: int, probe_at: Callable[[int], PeakPlan],
) -> tuple[TrainConfig, PeakPlan]:  # fmt: skip
    """`batch_size: auto` settled from the prediction, said in one line: the largest batch the first probe's line
    allows, then probed again up to that batch (`probe_at`) twice, so that the line is measured where it is used.
    Every process takes the smallest choice of all, so that all step alike."""
    samples = train_samples // accelerator.num_processes
    room = available(accelerator.device) if plan.inputs is not None else 0  # no prediction: no GPU to ask

    def agreed(choice: int) -> int:
        return min(row[0] for row in consensus.gather_ints(accelerator, [choice]))

    batch = agreed(consensus.agree(accelerator, lambda: auto_batch(plan, numels, setup, room, samples)))
    for _ in range(2):
        again = probe_at(batch)
        try:
            closer = auto_batch(again, numels, setup, room, samples)
        except UsageError:  # this probe could not run (out of memory, not on a line): the last answer stands
            closer = 0
        closer = agreed(closer)
        if not closer:
            break
        plan, settled, batch = again, closer == batch, closer
        if settled:
            break
    accumulation, processes = accelerator.gradient_accumulation_steps, accelerator.num_processes
    said = auto_line(plan, numels, setup, room, batch, samples)
    accelerator.print(f"{said}; global batch {global_batch(batch, accumulation, processes)}; "
                      f"the learning rate stays {config.lr:g}")  # fmt: skip
    return config.replace(batch_size=batch), plan
