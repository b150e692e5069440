"""Optimizer and learning-rate schedule from the TrainConfig."""

from __future__ import annotations

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from .config import TrainConfig


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """A plain torch optimizer; under DeepSpeed, Accelerate wraps it in the ZeRO optimizer."""
    params = model.parameters()
    wd = config.weight_decay
    if config.optimizer == "adam":
        return torch.optim.Adam(params, lr=config.lr, weight_decay=wd)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=config.lr, weight_decay=wd)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum, weight_decay=wd)
    return torch.optim.Adadelta(params, lr=config.lr, weight_decay=wd)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int, steps_per_epoch: int
) -> LRScheduler:
    """A schedule stepped once per optimizer step (`total_steps` of them on each process).

    'none' is a constant schedule, so that the loop never needs to ask whether one exists.
    """
    sched = torch.optim.lr_scheduler
    if config.scheduler == "onecycle":
        return sched.OneCycleLR(optimizer, max_lr=config.lr, total_steps=max(total_steps, 1))
    if config.scheduler == "cosine":
        return sched.CosineAnnealingLR(optimizer, T_max=max(total_steps, 1))
    if config.scheduler == "step":
        return sched.StepLR(optimizer, step_size=max(steps_per_epoch, 1), gamma=config.step_gamma)
    return sched.LambdaLR(optimizer, lambda _: 1.0)
