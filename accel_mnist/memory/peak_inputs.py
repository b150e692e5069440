"""What the peak prediction needs of a model and a run: activations traced, layers, DeepSpeed's buckets.

`inputs_for` (the meta-device trace) and `probed` (a probe's measurements, probe.py) serve
`accel-mnist estimate` and a run alike (plan.py reads the run's accelerator, config and data),
so that the estimate and results.json's `predicted.peak_allocated_bytes` come from the same
numbers.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
from torch import nn

from .activations import trace
from .allocator import run_expands_segments
from .peak import FRAGMENTATION, MAX_LIVE, REDUCE_BUCKET, PeakInputs
from .probe import Probe

CONVOLUTIONS = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)
COMPUTE_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp8": torch.bfloat16}
# What a forward pass that needs real values (`.item()`, data-dependent shapes, numpy) raises on meta
# tensors: RuntimeError and NotImplementedError from torch, anything from a caller's own code. The
# prediction is advice: a model it cannot trace trains without it.
TRACE_ERRORS = (Exception,)


def short_reason(exc: BaseException) -> str:
    """An exception as a short clause for a one-line message: its type and its first sentence, at most 160
    characters (a custom op's missing fake implementation, say, comes with a paragraph of advice)."""
    text = str(exc).strip().splitlines()
    if not text:
        return type(exc).__name__
    first = text[0].split(". ")[0].rstrip(".")  # the first sentence: the advice after it is torch's, not ours
    return f"{type(exc).__name__}: {first[:157] + '...' if len(first) > 160 else first}"


def not_on_meta(exc: BaseException) -> str:
    """Why a model is not traced where its forward pass raised on the meta device (a value read, a custom
    kernel with no fake implementation), in the words the run and `estimate` both print."""
    return f"its forward pass does not run on the meta device ({short_reason(exc)})"


def inputs_for(
    model: nn.Module, *, batch_size: int, eval_batch_size: int, mixed_precision: str, optimizer: str,
    data_bytes: int, input_shape: tuple[int, ...] = (1, 28, 28), zero: dict[str, Any] | None = None,
    autocast: bool = False,
) -> PeakInputs:  # fmt: skip
    """The peak's inputs for `model` (real or on the meta device) at these batch sizes; raises TRACE_ERRORS
    where its forward pass cannot run on the meta device. `zero`: a DeepSpeed config's zero_optimization;
    `autocast`: the weights stay fp32 and torch.autocast picks each call's precision (one process and DDP),
    else every float is in the 16-bit precision (DeepSpeed and FSDP)."""
    dtype = COMPUTE_DTYPES.get(mixed_precision)
    traced = trace(model, tuple(input_shape), batch_size, eval_batch_size, dtype, autocast=autocast)
    return replace(
        strategy_inputs(model, optimizer=optimizer, data_bytes=data_bytes, zero=zero),
        train_activation_bytes=traced.train_bytes, eval_activation_bytes=traced.eval_bytes, traced_batch=batch_size,
    )  # fmt: skip


def strategy_inputs(
    model: nn.Module, *, optimizer: str, data_bytes: int, zero: dict[str, Any] | None = None
) -> PeakInputs:
    """The peak's inputs other than the activations (zero until a trace or a probe fills them in)."""
    layers = [m for m in model.modules() if isinstance(m, (nn.Linear, *CONVOLUTIONS))]
    zero = zero or {}

    def number(key: str, default: int) -> int:  # "auto" or absent: DeepSpeed's default
        value = zero.get(key, default)
        return int(value) if isinstance(value, (int, float)) else default

    return PeakInputs(
        train_activation_bytes=0,
        eval_activation_bytes=0,
        data_bytes=data_bytes,
        cast_numel=sum(p.numel() for m in layers for p in m.parameters(recurse=False) if p.requires_grad),
        convolves=any(isinstance(m, CONVOLUTIONS) for m in layers),
        optimizer=optimizer,
        reduce_bucket_size=number("reduce_bucket_size", REDUCE_BUCKET),
        reduce_buckets=2 if zero.get("overlap_comm") is True else 1,
        max_live_parameters=number("stage3_max_live_parameters", MAX_LIVE),
        fragmentation=0.0 if run_expands_segments() else FRAGMENTATION,
    )


def probed(inputs: PeakInputs, probe: Probe, batch_size: int, eval_batch_size: int) -> PeakInputs:
    """`inputs` with the activation terms the probe measured at these batch sizes. The probe's bytes
    hold autocast's weight copies and the convolutions' workspaces already: those terms drop out."""
    return replace(
        inputs, train_activation_bytes=max(0, round(probe.train.per_sample * batch_size)),
        train_activation_fixed=round(probe.train.fixed), eval_activation_bytes=probe.evaluate.at(eval_batch_size),
        traced_batch=batch_size, cast_numel=0, convolves=False, source="probe",
    )  # fmt: skip
