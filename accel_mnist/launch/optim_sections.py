"""A DeepSpeed JSON's own `optimizer` / `scheduler` sections, checked before anything runs.

Such sections win over the TrainConfig (distributed/deepspeed_optim.py builds the placeholders
Accelerate wants); "auto" values in them are filled here from the TrainConfig, so that a key
nobody can fill, or a type DeepSpeed would reject, stops the launch with one line.
"""

from __future__ import annotations

from typing import Any

import torch

from ..config import TrainConfig
from ..errors import UsageError

# The TrainConfig's optimizer names as DeepSpeed's JSON spells them (DeepSpeed lowercases its own).
_DS_NAMES = {"adam": "adam", "adamw": "adamw", "sgd": "sgd", "adadelta": "adadelta"}
# "auto" keys of the JSON's scheduler params that the TrainConfig (or the run's length) fills.
_SCHEDULER_AUTO = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "total_num_steps")


def check_deepspeed_optim(ds: dict[str, Any], config: TrainConfig) -> list[str]:
    """Check a DeepSpeed JSON's optimizer/scheduler sections and fill their "auto" values from
    the TrainConfig (total_num_steps waits for deepspeed_optim.run_scheduler). Returns a note saying what the
    JSON overrides; raises UsageError for a section DeepSpeed would reject later."""
    notes = []
    if "optimizer" in ds:
        notes += _check_optimizer(ds, config)
    if "scheduler" in ds:
        notes += _check_scheduler(ds, config)
    if not notes:
        return []
    return ["the DeepSpeed JSON's own settings win over the training config's: " + "; ".join(notes)]


def _section(ds: dict[str, Any], key: str) -> tuple[str, dict[str, Any]]:
    section = ds[key]
    if not isinstance(section, dict) or not isinstance(section.get("type"), str):
        raise UsageError(f'DeepSpeed JSON: "{key}" needs a "type" (e.g. {{"type": "AdamW", "params": {{...}}}})')
    params = section.setdefault("params", {})
    if not isinstance(params, dict):
        raise UsageError(f'DeepSpeed JSON: "{key}.params" must be an object')
    return section["type"], params


def _check_optimizer(ds: dict[str, Any], config: TrainConfig) -> list[str]:
    from deepspeed.runtime.config import DEEPSPEED_OPTIMIZERS
    from deepspeed.runtime.zero.utils import ZERO_SUPPORTED_OPTIMIZERS

    name, params = _section(ds, "optimizer")
    known_to_ds = name.lower() in DEEPSPEED_OPTIMIZERS
    torch_cls = getattr(torch.optim, name, None)
    if not known_to_ds and not (isinstance(torch_cls, type) and issubclass(torch_cls, torch.optim.Optimizer)):
        raise UsageError(
            f"DeepSpeed JSON: optimizer type {name!r} is neither DeepSpeed's ({', '.join(DEEPSPEED_OPTIMIZERS)}) "
            "nor a torch.optim class"
        )
    # What accel_mnist's own optimizers would use, so that "auto" means the same run as without the JSON.
    auto = {"lr": config.lr, "weight_decay": config.weight_decay, "betas": [0.9, 0.999], "eps": 1e-8,
            "momentum": config.momentum}  # fmt: skip
    for key, value in params.items():
        if value == "auto":
            if key not in auto:
                raise UsageError(f'DeepSpeed JSON: optimizer.params.{key} is "auto", which nothing fills; set it')
            params[key] = auto[key]
    if not known_to_ds and torch_cls not in ZERO_SUPPORTED_OPTIMIZERS and ds.get("zero_optimization", {}).get("stage"):
        # Accelerate sets this for every torch optimizer it is given; the JSON's torch one is no different.
        ds.setdefault("zero_allow_untested_optimizer", True)
    notes = []
    if name.lower() != _DS_NAMES[config.optimizer]:
        notes.append(f"optimizer {name} (training config: {config.optimizer})")
    for key in ("lr", "weight_decay"):
        theirs, ours = params.get(key, 0.0 if key == "weight_decay" else None), getattr(config, key)
        if theirs is not None and theirs != ours:
            notes.append(f"{key} {theirs} (training config: {ours})")
    return notes


def _check_scheduler(ds: dict[str, Any], config: TrainConfig) -> list[str]:
    from deepspeed.runtime.lr_schedules import VALID_LR_SCHEDULES

    name, params = _section(ds, "scheduler")
    if name not in VALID_LR_SCHEDULES and not hasattr(torch.optim.lr_scheduler, name):
        raise UsageError(
            f"DeepSpeed JSON: scheduler type {name!r} is neither DeepSpeed's ({', '.join(VALID_LR_SCHEDULES)}) "
            "nor a torch.optim.lr_scheduler class"
        )
    peak = ds.get("optimizer", {}).get("params", {}).get("lr", config.lr)
    # As Accelerate fills them (Accelerator._prepare_deepspeed): warmup from 0 to the optimizer's
    # lr; the TrainConfig has no warmup length, and DeepSpeed >= 0.19.6 refuses 0 steps, so 1.
    auto = {"warmup_min_lr": 0.0, "warmup_max_lr": peak, "warmup_num_steps": 1}
    for key, value in params.items():
        if value == "auto" and key not in _SCHEDULER_AUTO:
            raise UsageError(f'DeepSpeed JSON: scheduler.params.{key} is "auto", which nothing fills; set it')
        if value == "auto" and key in auto:
            params[key] = auto[key]
    return [f"scheduler {name} (training config: {config.scheduler})"] if config.scheduler != "none" else []
