"""Where the optimizer and schedule come from: the TrainConfig's (optim.py), or a DeepSpeed JSON's
own `optimizer` / `scheduler` sections, which then win, as Accelerate requires.

A DeepSpeed JSON that brings its own optimizer or schedule cannot be combined with torch objects
built from the TrainConfig: Accelerate wants `DummyOptim` / `DummyScheduler` placeholders, and
DeepSpeed builds and steps the real ones inside the engine. "auto" values in those sections are
filled from the TrainConfig before anything runs (launch/optim_sections.py), so that a key nobody
can fill stops the run early.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from ..config import TrainConfig
from ..optim import build_optimizer as build_torch_optimizer
from ..optim import torch_scheduler


def run_optimizer(model: nn.Module, config: TrainConfig, deepspeed_plugin: Any = None) -> Any:
    """A plain torch optimizer (under DeepSpeed, Accelerate wraps it in the ZeRO optimizer), or
    Accelerate's DummyOptim when the DeepSpeed JSON has its own optimizer section."""
    if deepspeed_plugin is not None and "optimizer" in deepspeed_plugin.deepspeed_config:
        from accelerate.utils import DummyOptim

        section = deepspeed_plugin.deepspeed_config["optimizer"].get("params", {})
        return DummyOptim(
            model.parameters(), lr=section.get("lr", config.lr), weight_decay=section.get("weight_decay", 0.0)
        )
    return build_torch_optimizer(model, config)


def run_scheduler(
    optimizer: Any, config: TrainConfig, total_steps: int, steps_per_epoch: int, deepspeed_plugin: Any = None
) -> Any:
    """A schedule stepped once per optimizer step (`total_steps` of them on each process).

    Under a DeepSpeed JSON with a scheduler section: Accelerate's DummyScheduler, and DeepSpeed
    builds the JSON's schedule. With only an optimizer section, the TrainConfig's schedule is
    built by DeepSpeed on its own optimizer (Accelerate allows no torch schedule next to a
    DummyOptim). Either way the engine steps it, and the loop's `scheduler.step()` is a no-op.
    """
    ds = deepspeed_plugin.deepspeed_config if deepspeed_plugin is not None else {}
    if "scheduler" in ds:
        from accelerate.utils import DummyScheduler

        params = ds["scheduler"].setdefault("params", {})
        if params.get("total_num_steps") == "auto":
            params["total_num_steps"] = max(total_steps, 1)
        return DummyScheduler(optimizer)
    if "optimizer" in ds:
        from accelerate.utils import DummyScheduler

        return DummyScheduler(
            optimizer, lr_scheduler_callable=lambda opt: torch_scheduler(opt, config, total_steps, steps_per_epoch)
        )
    return torch_scheduler(optimizer, config, total_steps, steps_per_epoch)
