"""Build the Accelerator from the accelerate config, and describe what it chose.

This is the one place that knows about strategies: it reconciles the accelerate config
(DDP, DeepSpeed or FSDP, ZeRO stage, offload, mixed precision, dynamo) with the TrainConfig
(batch size, accumulation, clipping), so that the training loop never has to ask which
strategy runs. What the launcher and accelerate config ask for is read in launch_settings.py
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
from accelerate.utils import DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs

from .config import TrainConfig
from .elastic import join_restarted_group
from .errors import UsageError
from .launch_settings import check_launch, env_flag
from .optim import build_optimizer, build_scheduler, check_deepspeed_optim
from .step_path import direct_steps
from .strategy_checks import FSDP_NEEDS_A_DEVICE, check_strategy, describe_extra, multi_process_device_available

logger = get_logger(__name__)


def build_accelerator(config: TrainConfig, **kwargs: Any) -> Accelerator:
    """An Accelerator for `config`, with the strategy taken from the accelerate config/env.

    Resolves `config.grad_accum` (in place) from the launcher when the config leaves it unset,
    and raises UsageError, before anything is written, for any launcher setting the loop cannot
    honour, and where the launch asks for a strategy that Accelerate would not set up (it would
    train another one without a word).
    """
    launch = check_launch(config)
    grad_accum = launch.grad_accum
    use_deepspeed = env_flag("ACCELERATE_USE_DEEPSPEED")
    use_fsdp = env_flag("ACCELERATE_USE_FSDP")
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    # DeepSpeed calls torch collectives that torch has deprecated, and torch warns on every
    # call: under ZeRO-3 that is several lines per step, drowning everything else.
    warnings.filterwarnings(
        "ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor).* is deprecated", category=FutureWarning
    )
    handlers = list(kwargs.pop("kwargs_handlers", []))
    if use_fsdp and (env_flag("ACCELERATE_USE_CPU") or kwargs.get("cpu")):
        # Accelerate would quietly train without it; a user who asked for sharding should know.
        raise UsageError(
            "FSDP was requested together with --cpu/use_cpu, and Accelerate would silently drop FSDP; "
            "leave out --cpu (FSDP needs a GPU)"
        )
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
    join_restarted_group()  # after a torchrun restart: a process group on fresh store keys
    accelerator = Accelerator(
        # An explicit plugin, with the accumulation check_launch resolved from both sides.
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=grad_accum),
        # Our schedules count optimizer steps on one process; Accelerate's default would step
        # them num_processes times per step under DDP but once under DeepSpeed.
        step_scheduler_with_optimizer=False,
        kwargs_handlers=handlers,
        log_with=None if config.report_to == "none" else config.report_to,
        project_dir=config.output_dir,
        **kwargs,
    )
    if config.cudnn_benchmark:
        torch.backends.cudnn.benchmark = True
    if accelerator.mixed_precision == "fp16" and accelerator.device.type == "cpu":
        raise UsageError("mixed precision fp16 needs a GPU; on CPU launch with --mixed_precision no (or bf16)")
    check_strategy(accelerator, use_fsdp=use_fsdp, world_size=world_size)
    notes = [*launch.notes, *_align_deepspeed(accelerator, config, grad_accum)]
    for note in notes:
        logger.warning(note)  # main process only: once per run
    return accelerator


def _align_deepspeed(accelerator: Accelerator, config: TrainConfig, grad_accum: int) -> list[str]:
    """Make DeepSpeed's batch, accumulation and clipping settings those of the TrainConfig, and
    check a DeepSpeed JSON's own optimizer/scheduler; returns what to tell the user."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return []
    ds = plugin.deepspeed_config
    notes = check_deepspeed_optim(ds, config)
    wanted = {
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": config.batch_size * grad_accum * accelerator.num_processes,
        # DeepSpeed clips inside engine.step(); 0 turns its clipping off.
        "gradient_clipping": config.max_grad_norm or 0.0,
    }
    for key, value in wanted.items():
        old = ds.get(key, "auto")
        # Batch size and clipping belong to the TrainConfig; say so when a DeepSpeed JSON or the
        # YAML asked for something else (accumulation was reconciled, and reported, by check_launch).
        if key != "gradient_accumulation_steps" and old not in ("auto", "none", None, value):
            notes.append(f"DeepSpeed config sets {key}={old}; using the training config's {value}")
        ds[key] = value
    # Accelerate keeps its own copy of the accumulation steps and checks it against DeepSpeed's.
    plugin.gradient_accumulation_steps = grad_accum
    if accelerator.mixed_precision in ("fp16", "bf16"):
        # DeepSpeed 0.19 casts the parameters to 16 bits but keeps the buffers in fp32, unless
        # data_types.buffer_dtype says otherwise: BatchNorm's running statistics then no longer
        # match its weights ("Expected running_mean to have type Half but got Float", bncnn on
        # an H200). Cast them alike, as DeepSpeed did before; a JSON's own choice stays.
        ds.setdefault("data_types", {}).setdefault("buffer_dtype", accelerator.mixed_precision)
    return notes


def prepare(
    accelerator: Accelerator, config: TrainConfig, model: torch.nn.Module, total_steps: int, steps_per_epoch: int
) -> tuple[Any, Any, Any]:
    """Model, optimizer and schedule, built and prepared in the order the strategy needs.

    The loop gets the three prepared objects and never learns which strategy made them (a
    DeepSpeed JSON's own optimizer and schedule included: DeepSpeed steps those itself).
    """
    plugin = accelerator.state.deepspeed_plugin
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        # FSDP1 replaces the module's parameters (by flat ones, with use_orig_params false):
        # an optimizer built before the wrap would step tensors that no longer train, and
        # Accelerate's optimizer state mapping fails (KeyError: Parameter containing ...).
        model = accelerator.prepare(model)
        optimizer = build_optimizer(model, config, plugin)
        scheduler = build_scheduler(optimizer, config, total_steps, steps_per_epoch, plugin)
        optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
        return model, optimizer, scheduler
    # Everywhere else together: FSDP2 and DeepSpeed need the optimizer to hand its
    # parameters over to the sharded ones, and Accelerate requires both in one call.
    optimizer = build_optimizer(model, config, plugin)
    scheduler = build_scheduler(optimizer, config, total_steps, steps_per_epoch, plugin)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.mixed_precision == "fp8":
        _report_fp8(accelerator, model)
    return model, direct_steps(accelerator, optimizer), scheduler


_FP8_MODULES = ("torchao.", "transformer_engine.", "msamp.")


def _report_fp8(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Say which layers the fp8 backend converted; none converted means fp8 would be a silent no-op.

    torchao (Accelerate's first choice) skips the first and last Linear and any whose sizes are
    not multiples of 16, so small models may have nothing left to convert.
    """
    converted = [
        f"{name} ({type(m).__name__})"
        for name, m in accelerator.unwrap_model(model).named_modules()
        if type(m).__module__.startswith(_FP8_MODULES)
    ]
    backend = getattr(accelerator.fp8_backend, "value", str(accelerator.fp8_backend))
    if not converted:
        raise UsageError(
            f"mixed precision fp8 ({backend}) converted no layer of this model (torchao skips the first and last "
            "Linear and sizes not divisible by 16); launch with --mixed_precision bf16"
        )
    logger.info(f"fp8 ({backend}) layers: {', '.join(converted)}")


def describe(accelerator: Accelerator) -> dict[str, Any]:
    """What the accelerate config resolved to, for results.json and the log."""
    plugin = accelerator.state.deepspeed_plugin
    offload = {}
    if plugin is not None:
        zero = plugin.deepspeed_config.get("zero_optimization", {})
        offload = {
            "offload_optimizer": zero.get("offload_optimizer", {}).get("device", "none"),
            "offload_param": zero.get("offload_param", {}).get("device", "none"),
        }
    return {
        "distributed_type": accelerator.distributed_type.value,
        "num_processes": accelerator.num_processes,
        "zero_stage": int(plugin.zero_stage) if plugin is not None else 0,
        "mixed_precision": accelerator.mixed_precision,
        "device": accelerator.device.type,
        **offload,
        **describe_extra(accelerator),
    }
