"""The start of a run: every check on every rank, then the output directory opened, the data,
model, optimizer and schedule prepared, and any checkpoint loaded (training/loop.py trains it)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

from accelerate import Accelerator
from accelerate.utils import set_seed
from torch import nn

from ..config import TrainConfig
from ..distributed import consensus
from ..distributed.engine_prewarm import prewarm_engine
from ..distributed.memory import MemoryWatch, trainable_numels
from ..distributed.option_rules import Setup, channels_last_change, tell_change
from ..distributed.strategy import check_model, prepare, strategy_fields
from ..run import checkpoint as ckpt
from ..run.directory import RunDir
from ..versions import versions
from .cadence import Cadence
from .inputs import OwnData, load_run_data, model_for, record, run_facts
from .loaders import Loaders
from .loss_tally import LossTally
from .preemption import StopSignals
from .prewarm import prewarm
from .step import batch_loss, to_memory_format


@dataclass
class RunParts:
    """What a run is made of once started; training/loop.py's TrainingRun adds the training."""

    accelerator: Accelerator
    config: TrainConfig
    stop: StopSignals
    run_dir: RunDir
    state: ckpt.TrainState
    data: Loaders
    model: nn.Module
    optimizer: Any
    scheduler: Any
    cadence: Cadence
    steps_per_epoch: int
    facts: dict[str, Any]  # what results.json says about the setup
    memory: MemoryWatch  # model states held and predicted, and the peaks: counted at evaluations


def start_run(
    accelerator: Accelerator,
    config: TrainConfig,
    model: nn.Module | None,
    stop: StopSignals,
    run_dir: RunDir,
    own: OwnData,
) -> RunParts | dict[str, Any]:
    """Check everything on every rank, then open the output directory and prepare the objects;
    a finished run's results instead where `output_dir` holds one."""
    strategy = strategy_fields(accelerator)
    plan = run_dir.plan()  # locked, then agreed by every rank: what --resume-from means here
    if plan.finished is not None:
        accelerator.print(f"{config.output_dir} holds a finished run (results.json): nothing to train")
        return plan.finished
    resume, state = plan.resume, plan.state or ckpt.TrainState()
    # Every pickle of the checkpoint is checked before anything is loaded or written.
    rng_states = ckpt.verify_checkpoint(accelerator, resume, config.trust_checkpoint) if resume else {}

    with run_dir.data_first():  # one process per copy of the data directory downloads, then the others read
        run_data = load_run_data(config, own)
    set_seed(config.seed)  # after the data: a Dataset of the caller's may draw from the RNG as it is read
    model_name = config.model if model is None else type(model).__name__
    setup = Setup.of(accelerator)
    model = to_memory_format(model_for(accelerator, config, model, run_data), config, setup)
    if accelerator.process_index:  # dropout masks of its own; rank 0 keeps the stream of one process
        set_seed(config.seed, device_specific=True)
    data = Loaders(run_data.train, run_data.test, config, accelerator)
    steps_per_epoch = math.ceil(len(data) / accelerator.gradient_accumulation_steps)
    total_steps = steps_per_epoch * config.epochs
    if config.max_steps:
        total_steps = min(total_steps, config.max_steps)
    saved_strategy = state.strategy  # what the checkpoint was saved under, before it is overwritten
    if resume:
        saved, where, settings, described = state, resume, config.to_dict(), run_data.state_fields
        consensus.agree(
            accelerator, lambda: ckpt.check_compatible(saved, strategy, settings, where, total_steps, described)
        )
        state.loss_sums = ckpt.rescale_loss_sums(state, accelerator.num_processes)
    state.strategy, state.config, state.total_steps = strategy, config.to_dict(), total_steps
    record(state, model_name, model, run_data)
    check_model(accelerator, model)
    # Only now, with every check passed on every rank, is the output directory written (its lock aside).
    run_dir.open(plan)
    if config.report_to != "none":
        hparams = {k: "none" if v is None else v for k, v in state.config.items()}
        accelerator.init_trackers("accel_mnist", config=hparams)
    facts = {
        **run_facts(state, model),
        "global_batch_size": config.batch_size * accelerator.gradient_accumulation_steps * accelerator.num_processes,
        **strategy,
        "data_loader": data.kind,
        "prewarm_seconds": 0.0,
        "versions": versions(),
        "changes": [],  # what runs otherwise than the config asked, each said in one line
    }
    if config.channels_last and (line := channels_last_change(setup)):
        tell_change(accelerator, facts["changes"], line)
    if config.prewarm:
        rehearsals = (data.rehearse, lambda: LossTally.rehearse(accelerator.device))
        per_process = len(run_data.train) // accelerator.num_processes
        facts["prewarm_seconds"] = prewarm(
            model, config, accelerator.device, per_process, rehearsals, state.input_shape, accelerator.autocast
        )
    numels = trainable_numels(model)  # before prepare, which may shard the parameters
    # DeepSpeed's step launches kernels of its own: a throwaway engine on this copy loads them.
    engine_twin = copy.deepcopy(model) if config.prewarm and accelerator.state.deepspeed_plugin else None
    model, optimizer, scheduler = prepare(
        accelerator, config, model, state.total_steps, steps_per_epoch, bool(resume), saved_strategy
    )
    if engine_twin is not None:
        batch_shape = (config.batch_size, *state.input_shape)
        facts["prewarm_engine_seconds"] = prewarm_engine(
            accelerator, engine_twin, config, batch_shape,
            lambda m, x, y, dtype: batch_loss(m, x, y, config.channels_last, dtype),
        )  # fmt: skip
        facts["prewarm_seconds"] += facts["prewarm_engine_seconds"]
        del engine_twin
    memory = MemoryWatch.start(accelerator, config, strategy, numels, model, optimizer)
    if resume:
        ckpt.load_checkpoint(accelerator, resume, rng_states, config.trust_checkpoint)
        accelerator.print(f"resumed from {resume} at step {state.step}")
    cadence = Cadence.of(config, state.total_steps)
    return RunParts(accelerator, config, stop, run_dir, state, data, model, optimizer, scheduler, cadence,
                    steps_per_epoch, facts, memory)  # fmt: skip
