"""Build the Accelerator from the accelerate config, and record what it chose (strategy_fields).

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
from accelerate.utils import AutocastKwargs, DistributedType, GradientAccumulationPlugin, InitProcessGroupKwargs

from ..config import AUTO_BATCH, TrainConfig
from ..errors import UsageError
from ..launch.elastic import join_restarted_group
from ..launch.launchers import (
    WITHOUT_DEEPSPEED,
    env_flag,
    fp16_on_cpu,
    process_group_of_one,
    started_by_deepspeed_launcher,
)
from ..launch.settings import DEEPSPEED_WITH_CPU, LaunchSettings, check_launch
from ..launch.watch import watch_launcher
from ..optim import build_optimizer, build_scheduler, check_deepspeed_optim
from .deepspeed_ops import align_cuda_arch_list
from .deepspeed_plugin import fresh_json_values, process_deepspeed_plugin
from .step import ddp_side_stream, direct_steps
from .strategy_checks import (
    FSDP_NEEDS_A_DEVICE,
    check_strategy,
    fsdp_and_dynamo_fields,
    loads_universal,
    multi_process_device_available,
    strategy_line,
)

logger = get_logger(__name__)


def build_accelerator(config: TrainConfig, *, announce: bool = False, **kwargs: Any) -> Accelerator:
    """An Accelerator for `config`, with the strategy taken from the accelerate config/env, or
    from `config.deepspeed_config` under any launcher.

    Resolves `config.grad_accum` (in place) from the launcher when the config leaves it unset,
    and raises UsageError, before anything is written, for any launcher setting the loop cannot
    honour, and where the launch asks for a strategy that Accelerate would not set up (it would
    train another one without a word). With `announce` (a training run), the main process
    prints the strategy line first: strategy, precision, world size, device.
    """
    watch_launcher()  # a worker whose launcher died exits rather than train on as an orphan
    launch = check_launch(config)
    grad_accum = launch.grad_accum
    use_deepspeed = launch.use_deepspeed
    arch_note = align_cuda_arch_list(use_deepspeed)  # in every process, before DeepSpeed builds an op
    use_fsdp = env_flag("ACCELERATE_USE_FSDP")
    if use_deepspeed and kwargs.get("cpu"):
        raise UsageError(DEEPSPEED_WITH_CPU)
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
    if accelerator.mixed_precision == "fp16" and accelerator.device.type == "cpu":
        raise UsageError(fp16_on_cpu(launch.deepspeed_json))
    check_strategy(accelerator, use_fsdp=use_fsdp, use_deepspeed=use_deepspeed, world_size=world_size)
    notes = _align_and_collect_notes(accelerator, config, launch, arch_note)
    if announce:  # before the notes: the first line of a run says what runs
        accelerator.print(strategy_line(strategy_fields(accelerator)))
    for note in notes:
        logger.warning(note)  # main process only: once per run
    return accelerator


def _place_processes(
    use_fsdp: bool, use_deepspeed: bool, world_size: int, handlers: list[Any], kwargs: dict[str, Any]
) -> None:
    """Refuse FSDP without a device; join the processes of a launch on a machine without an
    accelerator (over gloo under DeepSpeed, else on the CPU), through `handlers` and `kwargs`."""
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


def _align_and_collect_notes(
    accelerator: Accelerator, config: TrainConfig, launch: LaunchSettings, arch_note: str | None
) -> list[str]:
    """DeepSpeed's settings made the TrainConfig's (_align_deepspeed), and what to tell the user:
    the launch's notes, those of the alignment, the CUDA arch list's, a DeepSpeed launcher's."""
    notes = [
        *launch.notes,
        *_align_deepspeed(accelerator, config, launch.grad_accum),
        *([arch_note] if arch_note else []),
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
    if accelerator.mixed_precision in ("fp16", "bf16"):
        # DeepSpeed 0.19 casts the parameters to 16 bits but keeps the buffers in fp32, unless
        # data_types.buffer_dtype says otherwise: BatchNorm's running statistics then no longer
        # match its weights ("Expected running_mean to have type Half but got Float", bncnn on
        # an H200). Cast them alike, as DeepSpeed did before; a JSON's own choice stays.
        ds.setdefault("data_types", {}).setdefault("buffer_dtype", accelerator.mixed_precision)
    return notes


def deepspeed_batch(batch_size: int, grad_accum: int, num_processes: int) -> dict[str, int]:
    """DeepSpeed's two batch settings for a per-process batch."""
    return {"train_micro_batch_size_per_gpu": batch_size, "train_batch_size": batch_size * grad_accum * num_processes}


def set_batch(accelerator: Accelerator, batch_size: int) -> None:
    """Write a batch settled after the Accelerator was built (`batch_size: auto`) into DeepSpeed's config."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is not None:
        batch = deepspeed_batch(batch_size, accelerator.gradient_accumulation_steps, accelerator.num_processes)
        plugin.deepspeed_config.update(batch)


def prepare(
    accelerator: Accelerator,
    config: TrainConfig,
    model: torch.nn.Module,
    total_steps: int,
    steps_per_epoch: int,
    resuming: bool = False,
    saved_strategy: dict[str, Any] | None = None,
) -> tuple[Any, Any, Any]:
    """Model, optimizer and schedule, built and prepared in the order the strategy needs.

    The loop gets the three prepared objects and never learns which strategy made them (a
    DeepSpeed JSON's own optimizer and schedule included: DeepSpeed steps those itself).
    `resuming`: a checkpoint (saved under `saved_strategy`) is loaded into them next, so whatever
    it must find is made here.
    """
    plugin = accelerator.state.deepspeed_plugin
    if resuming and plugin is not None and loads_universal(accelerator, saved_strategy or {}):
        # ZeRO shards of another number of processes: run/universal.py converts them.
        plugin.deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True
    if accelerator.distributed_type == DistributedType.FSDP and not accelerator.is_fsdp2:
        # FSDP1 replaces the module's parameters (by flat ones, with use_orig_params false):
        # an optimizer built before the wrap would step tensors that no longer train, and
        # Accelerate's optimizer state mapping fails (KeyError: Parameter containing ...).
        model = accelerator.prepare(model)
        optimizer = build_optimizer(model, config, plugin)
        scheduler = build_scheduler(optimizer, config, total_steps, steps_per_epoch, plugin)
        optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
        if resuming:
            _allocate_optimizer_state(optimizer.optimizer)
        return model, optimizer, scheduler
    # Everywhere else together: FSDP2 and DeepSpeed need the optimizer to hand its
    # parameters over to the sharded ones, and Accelerate requires both in one call.
    optimizer = build_optimizer(model, config, plugin)
    scheduler = build_scheduler(optimizer, config, total_steps, steps_per_epoch, plugin)
    with ddp_side_stream(accelerator, config):  # DDP's hooks then keep off the default stream
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    if accelerator.mixed_precision == "fp8":
        _report_fp8(accelerator, model)
    return model, direct_steps(accelerator, optimizer), scheduler


def _allocate_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its per-parameter state slots, leaving the parameters unchanged.

    Accelerate loads an FSDP1 SHARDED_STATE_DICT optimizer checkpoint into the slots that
    `FSDP.optim_state_dict(model, optimizer)` has at that moment; a fresh Adam has none, so the
    moments and step counts were silently dropped and the resumed run drifted (weights up to
    9.6e-3 apart on an H200). torch's own get_optimizer_state_dict (the FSDP2 path) allocates
    them the same way first: one step with zero gradients at lr 0. The checkpoint then
    overwrites every slot; the cost is one optimizer step per resume.
    """
    if optimizer.state:
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = torch.zeros_like(group["lr"]) if isinstance(group["lr"], torch.Tensor) else 0.0
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)


_FP8_MODULES = ("torchao.", "transformer_engine.", "msamp.")


def fp8_convertible_layers(model: torch.nn.Module) -> list[str]:
    """The Linear layers torchao's fp8 conversion takes under Accelerate's default filter: all but
    the first and last, with both sizes divisible by 16 (Accelerate's own filter functions)."""
    from accelerate.utils.ao import filter_linear_layers, find_first_last_linear_layers

    ends = list(find_first_last_linear_layers(model))
    return [
        name
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and filter_linear_layers(m, name, layers_to_filter=ends)
    ]


def check_model(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Refuse, before the output directory is touched, a model the strategy would leave as it is:
    fp8 through torchao with no layer to convert would train in full precision and call it fp8.
    A filter of the caller's own (AORecipeKwargs(module_filter_func=...)) is judged after prepare."""
    if accelerator.mixed_precision != "fp8" or _fp8_backend(accelerator) != "AO":
        return
    handler = getattr(accelerator, "ao_recipe_handler", None)
    if getattr(handler, "module_filter_func", None) is None and not fp8_convertible_layers(model):
        raise UsageError(_NO_FP8_LAYER.format(backend="AO"))


_NO_FP8_LAYER = (
    "mixed precision fp8 ({backend}) converts no layer of this model (torchao skips the first and last Linear "
    "and sizes not divisible by 16); launch with --mixed_precision bf16"
)


def _fp8_backend(accelerator: Accelerator) -> str:
    backend = accelerator.fp8_backend
    return str(getattr(backend, "value", backend))


def _report_fp8(accelerator: Accelerator, model: torch.nn.Module) -> None:
    """Say which layers the fp8 backend converted; none converted means fp8 would be a silent no-op.

    check_model refused torchao's empty case already; this also covers the other backends.
    """
    converted = [
        f"{name} ({type(m).__name__})"
        for name, m in accelerator.unwrap_model(model).named_modules()
        if type(m).__module__.startswith(_FP8_MODULES)
    ]
    if not converted:
        raise UsageError(_NO_FP8_LAYER.format(backend=_fp8_backend(accelerator)))
    logger.info(f"fp8 ({_fp8_backend(accelerator)}) layers: {', '.join(converted)}")


def strategy_fields(accelerator: Accelerator) -> dict[str, Any]:
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
        **fsdp_and_dynamo_fields(accelerator),
    }
