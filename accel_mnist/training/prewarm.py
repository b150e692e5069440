"""An untimed warm-up step on a throwaway copy of the model, before the training clock starts.

The first step of a fresh process pays for loading GPU kernels and setting up cuBLAS/cuDNN, which
can take longer than a whole short run (measured: docs/measurements.md#trainingprewarmpy). Running
one forward, backward and optimizer step of the same shapes on a copy moves that cost out of the
training clock, into `prewarm_seconds`, without touching the model, the optimizer or any RNG stream
the run uses: the trained weights are the same with and without it.

The copy computes as the run will: in the precision the strategy computes in (16-bit weights under
DeepSpeed and FSDP, the run's autocast where its prepared model has one:
option_rules.copy_precision) and in its memory format. Kernels are loaded per dtype and layout, so a
bf16 run warmed in fp32 would still load its bf16 kernels for the epoch's last, smaller batch inside
the clock, where they slow the steps across the epoch's end (measured:
docs/measurements.md#trainingprewarmpy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch
from accelerate import Accelerator
from torch import nn

from ..config import TrainConfig
from ..distributed.strategy import AS_PREPARED_ELSEWHERE, CopyPrecision, Strategy
from ..model_output import logits_of
from ..models import throwaway_copy
from ..precision import sixteen_bit_dtype
from .loaders import Loaders
from .loss_tally import LossTally
from .step import batch_loss, step_input


def prewarm_run(
    accelerator: Accelerator, strategy: Strategy, config: TrainConfig, model: nn.Module, data: Loaders,
    train_samples: int, input_shape: Sequence[int],
) -> float:  # fmt: skip
    """Seconds of a run's prewarm (`prewarm` below) on a copy of its model: every batch shape's step at the
    strategy's precision, and the loop's own tensor work (the loaders' batch assembly, the loss tally).
    `train_samples`: the whole training set's; `input_shape`: one sample's."""
    rehearsals = (data.rehearse, partial(LossTally.rehearse, accelerator.device))
    per_process = train_samples // accelerator.num_processes
    return prewarm(model, config, accelerator.device, per_process, rehearsals, input_shape, accelerator.autocast,
                   strategy.copy_precision)  # fmt: skip


def prewarm(
    model: nn.Module,
    config: TrainConfig,
    device: torch.device,
    train_samples: int = 0,
    rehearsals: Sequence[Callable[[], object]] = (),
    input_shape: Sequence[int] = (1, 28, 28),
    autocast: Callable[[], AbstractContextManager[object]] = nullcontext,
    precision: CopyPrecision = AS_PREPARED_ELSEWHERE,
) -> float:
    """One step on a copy of `model` per training batch shape; returns the seconds of those steps and the
    evaluation's shape (the copy and its optimizer are built before the clock starts, see below).

    `train_samples` (per process) adds the epoch's last, smaller batch: a new shape makes cuDNN
    choose its kernels again at each epoch end. `rehearsals` run the loop's own per-step tensor
    work once on scratch data (assembling a batch, the loss bookkeeping): CUDA loads each kernel
    on its first launch (both measured: docs/measurements.md#trainingprewarmpy). `input_shape`:
    one sample's (C, H, W). `autocast`: the run's (`Accelerator.autocast`), for the forward passes where
    `precision` (option_rules.copy_precision: how the strategy's prepared model computes) says so.
    """
    from ..optim import build_optimizer

    devices = [] if device.type == "cpu" else [device.index or 0]
    with torch.random.fork_rng(devices=devices, device_type=device.type):
        weights = sixteen_bit_dtype(precision.weights) if precision.weights else torch.float32
        twin = throwaway_copy(model, device, weights if precision.weights else None).train()
        autocast = autocast if precision.autocast else nullcontext
        optimizer = build_optimizer(twin, config)
        # The clock starts after the copy's optimizer: a process's first torch optimizer imports torch._dynamo
        # (Optimizer.__init__ is wrapped to keep dynamo out), which the run's own optimizer would import without a
        # prewarm; where Python compiles the libraries' sources in each process that import was 5.3 s of a 6.6 s
        # prewarm (benchmarks/results/h100-2026-12-06-stacks).
        start = time.perf_counter()
        for size in sorted({config.batch_size, train_samples % config.batch_size} - {0}, reverse=True):
            inputs = torch.zeros(size, *input_shape, device=device)
            labels = torch.zeros(size, dtype=torch.long, device=device)
            with autocast():  # float32 inputs, as the loader yields them, cast as the step casts them
                loss = batch_loss(twin, inputs, labels, config.channels_last, weights, config.label_smoothing)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        for rehearse in rehearsals:
            rehearse()
        twin.eval()
        inputs = step_input(torch.zeros(config.eval_batch_size, *input_shape, device=device, dtype=weights),
                            config.channels_last)  # fmt: skip
        with torch.no_grad(), autocast():  # and the evaluation's shape, whose time the clock leaves out anyway
            logits_of(twin(inputs)).sum().item()
    del twin, optimizer
    return time.perf_counter() - start
