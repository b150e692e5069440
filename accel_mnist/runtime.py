"""Build the Accelerator from the accelerate config, and describe what it chose.

This is the one place that knows about strategies: it reconciles the accelerate config
(DDP or DeepSpeed, ZeRO stage, offload, mixed precision) with the TrainConfig (batch size,
accumulation, clipping), so that the training loop never has to ask which strategy runs.
"""

from __future__ import annotations

import functools
import inspect
import os
import warnings
from datetime import timedelta
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from accelerate.utils import GradientAccumulationPlugin, InitProcessGroupKwargs

from .config import TrainConfig
from .elastic import join_restarted_group
from .errors import UsageError
from .optim import build_optimizer, build_scheduler

logger = get_logger(__name__)


def _cache_lomo_check() -> None:
    """accelerate 1.15's optimizer step asks `is_lomo_available()` twice per step, and each ask
    searches sys.path: the largest per-step cost for small models (linear, batch 64, 2 CPU
    threads: 0.46-0.60 ms/step before, 0.34 ms after). The answer cannot change in a run."""
    import accelerate.accelerator
    import accelerate.optimizer

    check = getattr(accelerate.optimizer, "is_lomo_available", None)
    if check is not None and not hasattr(check, "cache_info"):
        cached = functools.cache(check)
        accelerate.optimizer.is_lomo_available = cached
        if getattr(accelerate.accelerator, "is_lomo_available", None) is check:
            accelerate.accelerator.is_lomo_available = cached


class _CachedSignatures:
    """`inspect` as accelerate.optimizer sees it, with `signature()` of methods cached.

    `AcceleratedOptimizer.zero_grad` calls `inspect.signature(self.optimizer.zero_grad)` on
    every step: about 40 us of a 340 us step (linear, batch 64, 2 CPU threads). A bound
    method's signature depends only on its function, so the cache is keyed by the function
    (holding no optimizer alive) and stays exact.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(inspect, name)

    @staticmethod
    def signature(obj: Any, *args: Any, **kwargs: Any) -> inspect.Signature:
        func = getattr(obj, "__func__", None)
        if args or kwargs or not inspect.ismethod(obj) or not inspect.isfunction(func):
            return inspect.signature(obj, *args, **kwargs)
        sig = _BOUND_SIGNATURES.get(func)
        if sig is None:
            sig = _BOUND_SIGNATURES[func] = inspect.signature(obj)
        return sig


_BOUND_SIGNATURES: dict[Any, inspect.Signature] = {}


def _speed_up_accelerate() -> None:
    """Remove per-step costs of accelerate 1.15 that do not change within a run (each guarded,
    so that a newer accelerate without them is left as it is)."""
    _cache_lomo_check()
    import accelerate.optimizer

    if getattr(accelerate.optimizer, "inspect", None) is inspect:
        accelerate.optimizer.inspect = _CachedSignatures()  # type: ignore[assignment]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes")


def build_accelerator(config: TrainConfig, **kwargs: Any) -> Accelerator:
    """An Accelerator for `config`, with the strategy taken from the accelerate config/env."""
    _speed_up_accelerate()
    use_deepspeed = _env_flag("ACCELERATE_USE_DEEPSPEED")
    # DeepSpeed calls torch collectives that torch has deprecated, and torch warns on every
    # call: under ZeRO-3 that is several lines per step, drowning everything else.
    warnings.filterwarnings(
        "ignore", message=r".*(all_gather_into_tensor|reduce_scatter_tensor).* is deprecated", category=FutureWarning
    )
    handlers = list(kwargs.pop("kwargs_handlers", []))
    if use_deepspeed and _env_flag("ACCELERATE_USE_CPU"):
        # Accelerate would quietly train without DeepSpeed; a user who asked for ZeRO should know.
        raise UsageError(
            "DeepSpeed was requested together with --cpu/use_cpu, and Accelerate would silently drop "
            "DeepSpeed; leave out --cpu (DeepSpeed runs on CPU when no GPU is present)"
        )
    if not torch.cuda.is_available() and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Started by torchrun on a machine without a GPU, Accelerate would pick no process-group
        # backend and run each process as its own world of one: every rank would train on all
        # the data (and DeepSpeed's batch-size check fails). Join them in one gloo group instead.
        if use_deepspeed:
            handlers.append(InitProcessGroupKwargs(backend="gloo", timeout=timedelta(minutes=10)))
        else:
            kwargs.setdefault("cpu", True)
    join_restarted_group()  # after a torchrun restart: a process group on fresh store keys
    accelerator = Accelerator(
        # An explicit plugin: the launcher's ACCELERATE_GRADIENT_ACCUMULATION_STEPS would
        # otherwise silently replace config.grad_accum.
        gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=config.grad_accum),
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
    _align_deepspeed(accelerator, config)
    return accelerator


_TRAIN_CONFIG_KEYS = ("gradient_accumulation_steps", "gradient_clipping")


def _align_deepspeed(accelerator: Accelerator, config: TrainConfig) -> None:
    """Make DeepSpeed's batch, accumulation and clipping settings those of the TrainConfig."""
    plugin = accelerator.state.deepspeed_plugin
    if plugin is None:
        return
    ds = plugin.deepspeed_config
    wanted = {
        "train_micro_batch_size_per_gpu": config.batch_size,
        "gradient_accumulation_steps": config.grad_accum,
        "train_batch_size": config.batch_size * config.grad_accum * accelerator.num_processes,
        # DeepSpeed clips inside engine.step(); 0 turns its clipping off.
        "gradient_clipping": config.max_grad_norm or 0.0,
    }
    for key, value in wanted.items():
        old = ds.get(key, "auto")
        # Accumulation and clipping belong to the TrainConfig; say so when the accelerate
        # config asked for something else (1 is the wizard's default for accumulation).
        unremarkable = ("auto", "none", None, value, *((1,) if key == "gradient_accumulation_steps" else ()))
        if key in _TRAIN_CONFIG_KEYS and old not in unremarkable:
            logger.warning(f"DeepSpeed config sets {key}={old}; using the training config's {value}")
        ds[key] = value
    # Accelerate keeps its own copy of the accumulation steps and checks it against DeepSpeed's.
    plugin.gradient_accumulation_steps = config.grad_accum


def prepare(
    accelerator: Accelerator, config: TrainConfig, model: torch.nn.Module, total_steps: int, steps_per_epoch: int
) -> tuple[Any, Any, Any]:
    """Model, optimizer and schedule, built and prepared in the order the strategy needs.

    The loop gets the three prepared objects and never learns which strategy made them.
    """
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, total_steps, steps_per_epoch)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    return model, optimizer, scheduler


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
    }
