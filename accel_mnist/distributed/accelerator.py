"""Build the Accelerator from the accelerate config; what it chose is described by strategy.py.

This is the one place that knows about strategies: it reconciles the accelerate config
(DDP, DeepSpeed or FSDP, ZeRO stage, offload, mixed precision, dynamo) with the TrainConfig
(batch size, accumulation, clipping), so that the training loop never has to ask which
strategy runs. What the launcher and accelerate config ask for is read in launch/settings.py
(before the Accelerator exists); what Accelerate then set up is checked in strategy_checks.py.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import AutocastKwargs, GradientAccumulationPlugin, InitProcessGroupKwargs

from ..config import AUTO_BATCH, TrainConfig
from ..errors import UsageError
from ..launch.bytecode import uncached_bytecode_note
from ..launch.elastic import join_restarted_group
from ..launch.launcher_watch import watch_launcher
from ..launch.launchers import (
    WITHOUT_DEEPSPEED,
    env_flag,
    process_group_of_one,
    started_by_deepspeed_launcher,
)
from ..launch.optim_sections import check_deepspeed_optim
from ..launch.settings import LaunchSettings, check_launch
from ..precision import is_sixteen_bit
from .deepspeed_ops import align_cuda_arch_list
from .deepspeed_plugin import fresh_json_values, process_deepspeed_plugin
from .strategy import Strategy
from .strategy_checks import FSDP_NEEDS_A_DEVICE, check_strategy, multi_process_device_available

logger = get_logger(__name__)


def build_accelerator(config: TrainConfig, *, announce: bool = False, **kwargs: Any) -> Accelerator:
    """An Accelerator for `config`, with the strategy taken from the accelerate config/env, or
    from `config.deepspeed_config` under any launcher.

    Takes the accumulation from the launcher where the config leaves `grad_accum` unset (the
    Accelerator's `gradient_accumulation_steps`; the config is not changed), and raises UsageError,
    before anything is written, for any launcher setting the loop cannot honour, and where the
    launch asks for a strategy that Accelerate would not set up (it would train another one
    without a word). With `announce` (a training run), the main process prints the strategy line
    first: strategy, precision, world size, device.
    """
    watch_launcher()  # a worker whose launcher died exits rather than train on as an orphan
    launch = check_launch(config, cpu=bool(kwargs.get("cpu")))
    grad_accum = launch.grad_accum
    use_deepspeed = launch.use_deepspeed
    arch_note = align_cuda_arch_list(use_deepspeed)  # in every process, before DeepSpeed builds an op
    use_fsdp = env_flag("ACCELERATE_USE_FSDP")
    if use_deepspeed:
        process_group_of_one()  # where no launcher set one up: DeepSpeed needs it even alone
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # DeepSpeed calls torch collectives that torch has deprecated, and torch warns on every
    # call: under ZeRO-3 that is several lines per step, drowning everything else.
    warnings.filterwarnings(
        "ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor).* is deprecated", category=FutureWarning
    )
    handlers = list(kwargs.pop("kwargs_handlers", []))
    if config.cuda_graph:  # autocast's weight cache would keep casts made during capture (torch.cuda.graphs docs)
        handlers.append(AutocastKwargs(cache_enabled=False))
    _place_processes(use_fsdp, use_deepspeed, world_size, handlers, kwargs)
    join_restarted_group()  # after a torchrun restart: a process group on fresh store keys
    accelerator = Accelerator(
        # An explicit plugin, with the accumulation check_launch resolved from both sides.
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=grad_accum),
        # Our schedules count optimizer steps on one process; Accelerate's default would step
        # them num_processes times per step under DDP but once under DeepSpeed.
        step_scheduler_with_optimizer=False,
        deepspeed_plugin=process_deepspeed_plugin(launch),
        kwargs_handlers=handlers,
        log_with=None if config.report_to == "none" else config.report_to,
        project_dir=config.output_dir,
        **kwargs,
    )
    fresh_json_values(accelerator)
    if config.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    check_strategy(accelerator, use_fsdp=use_fsdp, use_deepspeed=use_deepspeed, world_size=world_size,
                   deepspeed_json=launch.deepspeed_json)  # fmt: skip
    notes = _align_and_collect_notes(accelerator, config, launch, arch_note)
    if announce:  # before the notes: the first line of a run says what runs
        accelerator.print(Strategy.of(accelerator).line)
    for note in notes:
        logger.warning(note)  # main process only: once per run
    return accelerator


def _place_processes(
    use_fsdp: bool, use_deepspeed: bool, world_size: int, handlers: list[Any], kwargs: dict[str, Any]
) -> None:
    """Refuse FSDP without a device; join the processes of a launch on a machine without an
    accelerator (over gloo under DeepSpeed, else on the CPU), through `handlers` and `kwargs`."""
    has_device = multi_process_device_available()
    if use_fsdp and not has_device:
        raise UsageError(FSDP_NEEDS_A_DEVICE)
    if world_size > 1 and not has_device:
        # Started by torchrun on a machine without an accelerator, Accelerate would pick no
        # process-group backend and run each process as its own world of one: every rank would
        # train on all the data (and DeepSpeed's batch-size check fails). Join them over gloo.
        if use_deepspeed:
            handlers.append(InitProcessGroupKwargs(backend="gloo", timeout=timedelta(minutes=10)))
        else:
            kwargs.setdefault("cpu", True)


def _align_and_collect_notes(
    accelerator: Accelerator, config: TrainConfig, launch: LaunchSettings, arch_note: str | None
) -> list[str]:
    """DeepSpeed's settings made the TrainConfig's (_align_deepspeed), and what to tell the user:
    the launch's notes, those of the alignment, the CUDA arch list's, a DeepSpeed launcher's, and torch's
    sources compiled in this process (launch/bytecode.py)."""
    bytecode_note = uncached_bytecode_note()
    notes = [
        *launch.notes,
        *_align_deepspeed(accelerator, config, launch.grad_accum),
        *([arch_note] if arch_note else []),
        *([bytecode_note] if bytecode_note else []),
    ]
    if started_by_deepspeed_launcher() and not launch.use_deepspeed:
        notes.append(WITHOUT_DEEPSPEED.format(kind=accelerator.distributed_type.value))
    return notes


def _align_deepspeed(accelerator: Accelerator, config: TrainConfig, grad_accum: int) -> list[str]:
    """Make DeepSpeed's batch, accumulation and clipping settings those of the TrainConfig, and
    check a DeepSpeed JSON's own optimizer/scheduler; returns what to tell the user."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return []
    ds = plugin.deepspeed_config
    notes = check_deepspeed_optim(ds, config)
    wanted = {
        **deepspeed_batch(config.batch_size, grad_accum, accelerator.num_processes),
        "gradient_accumulation_steps": grad_accum,
        # DeepSpeed clips inside engine.step(); 0 turns its clipping off.
        "gradient_clipping": config.max_grad_norm or 0.0,
    }
    if config.batch_size == AUTO_BATCH:  # settled before prepare (memory/plan.py), then set_batch writes it
        wanted = {k: v for k, v in wanted.items() if "batch_size" not in k}
    for key, value in wanted.items():
        old = ds.get(key, "auto")
        # Batch size and clipping belong to the TrainConfig; say so when a DeepSpeed JSON or the
        # YAML asked for something else (accumulation was reconciled, and reported, by check_launch).
        if key != "gradient_accumulation_steps" and old not in ("auto", "none", None, value):
            notes.append(f"DeepSpeed config sets {key}={old}; using the training config's {value}")
        ds[key] = value
    # Accelerate keeps its own copy of the accumulation steps and checks it against DeepSpeed's.
    plugin.gradient_accumulation_steps = grad_accum
    if is_sixteen_bit(accelerator.mixed_precision):
        # DeepSpeed 0.19 casts the parameters to 16 bits but keeps the buffers in fp32, unless
        # data_types.buffer_dtype says otherwise: BatchNorm's running statistics then no longer
        # match its weights ("Expected running_mean to have type Half but got Float";
        # docs/measurements.md#distributedacceleratorpy). Cast them alike, as DeepSpeed did before;
        # a JSON's own choice stays.
        ds.setdefault("data_types", {}).setdefault("buffer_dtype", accelerator.mixed_precision)
    return notes


def deepspeed_batch(batch_size: int, grad_accum: int, num_processes: int) -> dict[str, int]:
    """DeepSpeed's two batch settings for a per-process batch."""
    return {"train_micro_batch_size_per_gpu": batch_size, "train_batch_size": batch_size * grad_accum * num_processes}


def set_batch(accelerator: Accelerator, batch_size: int) -> None:
    """Write a batch settled after the Accelerator was built (`batch_size: auto`), and the accumulation
    with it (`global_batch_size` may choose one), into DeepSpeed's config and Accelerate's copy of it."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        accumulation = accelerator.gradient_accumulation_steps
        plugin.deepspeed_config.update(deepspeed_batch(batch_size, accumulation, accelerator.num_processes))
        plugin.deepspeed_config["gradient_accumulation_steps"] = accumulation
        plugin.gradient_accumulation_steps = accumulation
