"""The start of a run: every check on every rank, then the output directory opened, the data,
model, optimizer and schedule prepared, and any checkpoint loaded (training/loop.py trains it)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

from accelerate import Accelerator
from torch import nn

from ..config import AUTO_BATCH, TrainConfig
from ..distributed import consensus
from ..distributed.compile_threads import compile_threads
from ..distributed.engine_prewarm import prewarm_engine
from ..distributed.option_rules import (
    averaging_refusal,
    buffers_change,
    channels_last_change,
    float_buffers,
    tell_change,
)
from ..distributed.prepare import prepare
from ..distributed.strategy import Strategy
from ..errors import UsageError, on_every_rank
from ..memory.allocator import settings as allocator_settings
from ..memory.memory_watch import MemoryWatch, trainable_numels
from ..memory.plan import PeakPlan
from ..models import throwaway_copy
from ..run import checkpoint as ckpt
from ..run.directory import Plan, RunDir
from .averaging import WeightAverage, resident_bytes
from .cadence import Cadence
from .inputs import OwnData, RunData, RunModel, load_run_data, run_model
from .loaders import Loaders
from .memory_plan import plan_memory
from .preemption import StopSignals
from .prewarm import prewarm_run
from .profiling import check_steps
from .records import SetupFacts, versions
from .resolved import ResolvedRun, StepPlan
from .run import TrainingRun
from .state import Progress, RunDescription, check_compatible, rescale_loss_sums
from .state import read as read_state
from .step import batch_loss


def start_run(
    accelerator: Accelerator,
    config: TrainConfig,
    model: nn.Module | None,
    stop: StopSignals,
    run_dir: RunDir,
    plan: Plan,
    own: OwnData,
) -> TrainingRun:
    """Check everything on every rank, then open the output directory and prepare the objects.
    `plan`: what the output directory holds and `--resume-from` means there (RunDir.plan).

    The stages run in this order, each asking the component that owns it: the checkpoint's checks, the
    data, the model, the memory plan, the loaders and the schedule, the checks against the checkpoint, the
    output directory, the prewarm, prepare, the checkpoint's load.
    """
    strategy = Strategy.of(accelerator)
    resume, fresh = plan.resume, (Progress(), RunDescription())
    progress, was = read_state(plan.state, resume) if plan.state is not None and resume else fresh
    # Every pickle of the checkpoint is checked before anything is loaded or written.
    rng_states = ckpt.verify_checkpoint(accelerator, resume, config.trust_checkpoint) if resume else {}
    with run_dir.data_first():  # one process per copy of the data directory downloads, then the others read
        run_data = load_run_data(config, own)
    built = run_model(accelerator, strategy, config, model, run_data)
    model = built.module
    auto, step = config.batch_size == AUTO_BATCH, StepPlan.of(strategy, config)
    settled, peak = plan_memory(accelerator, config, strategy, step, model, run_data, was.config if resume else None)
    resolved = ResolvedRun(settled, replace(strategy, grad_accum=accelerator.gradient_accumulation_steps), step)
    config, strategy = resolved.config, resolved.strategy
    data = Loaders(run_data.train, run_data.test, config, accelerator)
    steps_per_epoch = math.ceil(len(data) / accelerator.gradient_accumulation_steps)
    saved = Strategy.from_fields(was.strategy) if resume else None
    cadence = Cadence.of(config, steps_per_epoch)
    total_steps = cadence.total_steps
    described = _describe(accelerator, config, progress, was, resume, strategy, total_steps, run_data, built)
    # Only now, with every check passed on every rank, is the output directory written (its lock aside).
    run_dir.open(plan, config)
    facts = _setup_facts(accelerator, resolved, auto, built, data, peak)
    if config.prewarm:
        facts.prewarm_seconds = prewarm_run(
            accelerator, strategy, config, model, data, len(run_data.train), described.input_shape
        )
    numels = trainable_numels(model)  # before prepare, which may shard the parameters
    peak = peak.with_data_bytes(data.device_bytes(), resident_bytes(model, config.ema_decay))
    # DeepSpeed's step launches kernels of its own: a throwaway engine on this copy loads them.
    engine_twin = throwaway_copy(model) if config.prewarm and strategy.runs_engine else None
    model, optimizer, scheduler = prepare(accelerator, config, model, total_steps, steps_per_epoch, strategy, saved)
    if engine_twin is not None:
        _prewarm_engine(accelerator, config, engine_twin, described.input_shape, facts)
        del engine_twin
    memory = MemoryWatch.start(accelerator, config, strategy, numels, model, optimizer, peak)
    average = WeightAverage.start(accelerator, config.ema_decay, model)  # before a checkpoint's load
    if resume:  # the checkpoint, checked at the plan, into the prepared objects and the RNGs
        ckpt.load_checkpoint(accelerator, resume, rng_states, config.trust_checkpoint)
        accelerator.print(f"resumed from {resume} at step {progress.step}")
    return TrainingRun(accelerator, resolved, stop, run_dir, progress, described, data, model, optimizer,
                       scheduler, cadence, steps_per_epoch, facts, memory, average)  # fmt: skip


def _prewarm_engine(
    accelerator: Accelerator, config: TrainConfig, twin: nn.Module, input_shape: list[int], facts: SetupFacts
) -> None:
    """Step a throwaway DeepSpeed engine on `twin` (distributed/engine_prewarm.py), its seconds in `facts`."""
    facts.prewarm_engine_seconds = prewarm_engine(
        accelerator, twin, config, (config.batch_size, *input_shape),
        lambda m, x, y, dtype: batch_loss(m, x, y, config.channels_last, dtype, config.label_smoothing),
    )  # fmt: skip
    facts.prewarm_seconds += facts.prewarm_engine_seconds


def _describe(
    accelerator: Accelerator,
    config: TrainConfig,
    progress: Progress,
    was: RunDescription,
    resume: Path | None,
    strategy: Strategy,
    total_steps: int,
    run_data: RunData,
    built: RunModel,
) -> RunDescription:
    """Check a checkpoint (at `progress`, of the run `was`) against this run on every rank (resuming) and
    that a `--profile` window fits the run, then describe this run: its strategy, config and length, its
    model and data (`built`)."""
    check_steps(config.profile, total_steps)
    if config.ema_decay is not None and (why := averaging_refusal(strategy)):
        raise on_every_rank(UsageError(why))
    if resume:
        # The loss sums for this world size (nothing is loaded yet: a refusal below loses nothing).
        progress.loss_sums = rescale_loss_sums(progress, accelerator.num_processes)
        settings, data_fields = config.to_dict(), run_data.state_fields
        consensus.agree(
            accelerator,
            lambda: check_compatible(progress, was, strategy, settings, resume, total_steps, data_fields),
        )
    return replace(built.described, total_steps=total_steps, strategy=strategy.fields(), config=config.to_dict())


def _setup_facts(
    accelerator: Accelerator, resolved: ResolvedRun, auto: bool, built: RunModel, data: Loaders, peak: PeakPlan
) -> SetupFacts:
    """What results.json says about the setup of the `resolved` run (`auto`: its batch was asked as `auto`),
    with each way the run differs from what the config asked said here in one line."""
    config, strategy = resolved.config, resolved.strategy
    facts = SetupFacts(model=built.facts, batch_size=config.batch_size, batch_size_auto=auto,
                       global_batch_size=resolved.global_batch_size, strategy=strategy.fields(),
                       data_loader=data.kind, allocator_settings=allocator_settings(),
                       probe_seconds=peak.probe_seconds, versions=versions(),
                       compile_threads=compile_threads() if strategy.dynamo != "no" else None,
                       ema_decay=config.ema_decay)  # fmt: skip
    if config.channels_last and (line := channels_last_change(strategy)):
        tell_change(accelerator, facts.changes, line)
    if line := buffers_change(strategy, float_buffers(built.module)):
        tell_change(accelerator, facts.changes, line)
    return facts
