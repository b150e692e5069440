"""What the peak prediction needs of a model and a run: activations traced, layers, DeepSpeed's buckets.

`inputs_for` serves `accel-mnist estimate` and a run alike (`run_inputs` reads the run's
accelerator, config and data), so that the estimate and results.json's
`predicted.peak_allocated_bytes` come from the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch
from accelerate import Accelerator
from accelerate.logging import get_logger
from torch import nn

from ..config import TrainConfig
from .activations import trace
from .peak import MAX_LIVE, REDUCE_BUCKET, PeakInputs

logger = get_logger(__name__)
CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
COMPUTE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
# What a forward pass that needs real values (`.item()`, data-dependent shapes, numpy) raises on meta
# tensors: RuntimeError and NotImplementedError from torch, anything from a caller's own code. The
# prediction is advice: a model it cannot trace trains without it.
TRACE_ERRORS = (Exception,)


def inputs_for(
    model: nn.Module, *, batch_size: int, eval_batch_size: int, mixed_precision: str, optimizer: str,
    data_bytes: int, input_shape: tuple[int, ...] = (1, 28, 28), zero: dict[str, Any] | None = None,
) -> PeakInputs:  # fmt: skip
    """The peak's inputs for `model` (real or on the meta device) at these batch sizes; raises TRACE_ERRORS
    where its forward pass cannot run on the meta device. `zero`: a DeepSpeed config's zero_optimization."""
    traced = trace(model, tuple(input_shape), batch_size, eval_batch_size, COMPUTE_DTYPES.get(mixed_precision))
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, *CONVOLUTIONS))]
    zero = zero or {}

    def number(key: str, default: int) -> int:  # "auto" or absent: DeepSpeed's default
        value = zero.get(key, default)
        return int(value) if isinstance(value, (int, float)) else default

    return PeakInputs(
        train_activation_bytes=traced.train_bytes,
        eval_activation_bytes=traced.eval_bytes,
        data_bytes=data_bytes,
        cast_numel=sum(p.numel() for m in layers for p in m.parameters(recurse=False) if p.requires_grad),
        convolves=any(isinstance(m, CONVOLUTIONS) for m in layers),
        optimizer=optimizer,
        reduce_bucket_size=number("reduce_bucket_size", REDUCE_BUCKET),
        reduce_buckets=2 if zero.get("overlap_comm") is True else 1,
        max_live_parameters=number("stage3_max_live_parameters", MAX_LIVE),
        traced_batch=batch_size,
    )


def run_inputs(
    accelerator: Accelerator, config: TrainConfig, strategy: dict[str, Any], model: nn.Module,
    input_shape: tuple[int, ...], data_bytes: int,
) -> PeakInputs | None:  # fmt: skip
    """The run's peak inputs, traced before `prepare`; None on a CPU (its peak is the RSS) or where the
    forward pass cannot run on meta tensors (said in the log)."""
    if accelerator.device.type == "cpu":
        return None
    plugin = accelerator.state.deepspeed_plugin
    try:
        return inputs_for(
            model, batch_size=config.batch_size, eval_batch_size=config.eval_batch_size,
            mixed_precision=strategy.get("mixed_precision", "no"), optimizer=str(config.optimizer),
            data_bytes=data_bytes, input_shape=input_shape,
            zero=plugin.deepspeed_config.get("zero_optimization", {}) if plugin is not None else None,
        )  # fmt: skip
    except TRACE_ERRORS as exc:
        logger.info(f"peak memory not predicted: the model's forward pass does not run on the meta device ({exc})")
        return None
