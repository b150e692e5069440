"""Model, optimizer and schedule prepared in the order the strategy needs, and the models a
strategy would leave as they are refused before anything is written (fp8 with no layer to convert)."""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger

from ..config import TrainConfig
from ..errors import UsageError
from .ddp_capture import ddp_side_stream
from .deepspeed_optim import run_optimizer, run_scheduler
from .lean_steps import direct_steps
from .strategy import Strategy

logger = get_logger(__name__)


def prepare(
    accelerator: Accelerator,
    config: TrainConfig,
    model: torch.nn.Module,
    total_steps: int,
    steps_per_epoch: int,
    strategy: Strategy | None = None,
    saved: Strategy | None = None,
) -> tuple[Any, Any, Any]:
    """Model, optimizer and schedule, built and prepared in the order the strategy needs.

    The loop gets the three prepared objects and never learns which strategy made them (a
    DeepSpeed JSON's own optimizer and schedule included: DeepSpeed steps those itself).
    `strategy`: the run's (default: the Accelerator's). `saved`: a checkpoint saved under that
    strategy is loaded into them next, so whatever it must find is made here.
    """
    strategy = strategy or Strategy.of(accelerator)
    plugin = accelerator.state.deepspeed_plugin
    if saved is not None and strategy.loads_universal(saved):
        # ZeRO shards of another number of processes: run/universal.py converts them.
        plugin.deepspeed_config.setdefault("checkpoint", {})["load_universal"] = True
    if strategy.fsdp_version == 1:
        # FSDP1 replaces the module's parameters (by flat ones, with use_orig_params false):
        # an optimizer built before the wrap would step tensors that no longer train, and
        # Accelerate's optimizer state mapping fails (KeyError: Parameter containing ...).
        model = accelerator.prepare(model)
    optimizer = run_optimizer(model, config, plugin)
    scheduler = run_scheduler(optimizer, config, total_steps, steps_per_epoch, plugin)
    if strategy.fsdp_version == 1:
        optimizer, scheduler = accelerator.prepare(optimizer, scheduler)
        if saved is not None:
            allocate_optimizer_state(optimizer.optimizer)
        return model, optimizer, scheduler
    # Everywhere else together: FSDP2 and DeepSpeed need the optimizer to hand its
    # parameters over to the sharded ones, and Accelerate requires both in one call.
    with ddp_side_stream(accelerator, config):  # DDP's hooks then keep off the default stream
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    optimizer = direct_steps(accelerator, optimizer)
    if accelerator.mixed_precision == "fp8":
        _report_fp8(accelerator, model)
    return model, optimizer, scheduler


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


def allocate_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its per-parameter state slots, leaving the parameters unchanged.

    Accelerate loads an FSDP1 SHARDED_STATE_DICT optimizer checkpoint into the slots that
    `FSDP.optim_state_dict(model, optimizer)` has at that moment; a fresh Adam has none, so the
    moments and step counts would be silently dropped and the resumed run would drift from the
    uninterrupted one (measured: docs/measurements.md#distributedpreparepy). torch's own
    get_optimizer_state_dict (the FSDP2 path) allocates them the same way first: one step with zero
    gradients at lr 0. The checkpoint then overwrites every slot; the cost is one optimizer step per
    resume.
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
