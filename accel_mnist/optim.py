"""The TrainConfig's optimizer and learning-rate schedule, as torch builds them.

Where a strategy brings its own (a DeepSpeed JSON's `optimizer` / `scheduler` sections), the
strategy's room decides: distributed/deepspeed_optim.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from .caller import setting
from .config import TrainConfig

# config.optimizer -> the torch class it builds (outside a DeepSpeed JSON's own optimizer): its
# __name__ is how the CUDA-graph rule and its lines name it (option_rules.capture_refusal).
OPTIMIZER_CLASSES: dict[str, type[torch.optim.Optimizer]] = {
    "adam": torch.optim.Adam,
    "adamw": torch.optim.AdamW,
    "sgd": torch.optim.SGD,
    "adadelta": torch.optim.Adadelta,
}


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The TrainConfig's torch optimizer over the model's parameters."""
    # Called through Callable: mypy reads the type's constructor as the base Optimizer's.
    cls: Callable[..., torch.optim.Optimizer] = OPTIMIZER_CLASSES[config.optimizer]
    extra: dict[str, Any] = {"momentum": config.momentum} if cls is torch.optim.SGD else {}
    return cls(model.parameters(), lr=config.lr, weight_decay=config.weight_decay, **extra)


def optimizer_class_name(config: TrainConfig) -> str:
    """The class name of the torch optimizer `config` builds (SGD for sgd, Adadelta for adadelta...)."""
    return OPTIMIZER_CLASSES[config.optimizer].__name__


def schedule_refusal(config: TrainConfig) -> str | None:
    """Why torch cannot run the config's schedule over the config's optimizer (None: it can).

    OneCycleLR cycles the optimizer's momentum (SGD's) or beta1 (Adam's) unless told not to, and
    refuses, mid-setup, an optimizer that has neither ("optimizer must support momentum or beta1
    with `cycle_momentum` option enabled"): Adadelta.
    """
    if config.scheduler == "onecycle" and config.cycle_momentum and config.optimizer == "adadelta":
        return (
            "scheduler onecycle cycles the optimizer's momentum (cycle_momentum: true) and adadelta has none; "
            f"set {setting('cycle_momentum', False)}, or use adam, adamw or sgd"
        )
    return None


def torch_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int, steps_per_epoch: int
) -> LRScheduler:
    """The TrainConfig's schedule. 'none' is a constant one, so the loop never asks whether one exists."""
    sched = torch.optim.lr_scheduler
    if config.scheduler == "onecycle":
        return sched.OneCycleLR(
            optimizer, max_lr=config.lr, total_steps=max(total_steps, 1), cycle_momentum=config.cycle_momentum
        )
    if config.scheduler == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=max(total_steps, 1))
    if config.scheduler == "step":
        return sched.StepLR(optimizer, step_size=max(steps_per_epoch, 1), gamma=config.step_gamma)
    return sched.LambdaLR(optimizer, constant)


def constant(_step: int) -> float:
    """The factor of the 'none' schedule: the learning rate stays where the optimizer set it."""
    return 1.0


def is_constant(scheduler: Any) -> bool:
    """Whether `scheduler` (prepared by Accelerate or not) is the 'none' schedule: stepping it changes nothing."""
    inner = getattr(scheduler, "scheduler", scheduler)
    return isinstance(inner, torch.optim.lr_scheduler.LambdaLR) and all(f is constant for f in inner.lr_lambdas)
