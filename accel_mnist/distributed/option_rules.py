"""What a training option becomes under the strategy a launch set up: as asked, or changed with one line.

The runtime and the option matrix (tests/matrix.py) ask the same functions, so the table
in docs/strategies.md is what a run does. Each rule reads a `Setup`: the few facts of the
strategy that options depend on, taken from a live Accelerator (`Setup.of`) or written down
for a cell of the matrix. Refusals of a whole launch (fp16 on a CPU, FSDP without a GPU) stay
where the launch is checked (launch/settings.py, strategy.py, strategy_checks.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SIXTEEN_BIT = {"fp16": torch.float16, "bf16": torch.bfloat16}  # the precisions that cast weights or buffers


@dataclass(frozen=True)
class Setup:
    """The strategy as options see it: DistributedType name, device type, precision and the rest."""

    kind: str = "NO"
    device: str = "cpu"
    precision: str = "no"
    grad_accum: int = 1
    dynamo: str = "no"
    zero_stage: int = 0
    fsdp_version: int = 0
    scaler: bool = False  # a torch grad scaler: fp16 outside DeepSpeed

    @classmethod
    def of(cls, accelerator: Any) -> Setup:
        """The Setup of a live Accelerator (public attributes only)."""
        state = accelerator.state
        plugin = getattr(state, "deepspeed_plugin", None)
        fsdp = getattr(state, "fsdp_plugin", None)
        kind = str(getattr(accelerator.distributed_type, "value", accelerator.distributed_type))
        return cls(
            kind=kind,
            device=accelerator.device.type,
            precision=str(accelerator.mixed_precision),
            grad_accum=int(accelerator.gradient_accumulation_steps),
            dynamo=str(state.dynamo_plugin.backend.value).lower(),
            zero_stage=int(plugin.zero_stage) if plugin is not None and kind == "DEEPSPEED" else 0,
            fsdp_version=int(fsdp.fsdp_version) if fsdp is not None and kind == "FSDP" else 0,
            scaler=accelerator.scaler is not None,
        )

    @property
    def flattens(self) -> str | None:
        """The name of a strategy that flattens, shards or broadcasts parameters as contiguous memory."""
        if self.kind == "DEEPSPEED":
            return f"DeepSpeed ZeRO-{self.zero_stage}"
        if self.kind == "FSDP":
            return f"FSDP{self.fsdp_version}"
        return None


def channels_last_change(setup: Setup) -> str | None:
    """Why channels-last stays off the parameters under this strategy (None: they take it too).

    DeepSpeed broadcasts each parameter as bytes (`p.data.view(torch.uint8)`, which needs a
    unit last stride) and flattens them into contiguous buffers; FSDP flattens or shards them
    along dim 0. The inputs still go channels-last, and a convolution with a channels-last input
    computes and returns channels-last activations (cuDNN and oneDNN pick the layout from either
    operand), so the kernels keep their layout; the weight is converted inside each convolution.
    """
    name = setup.flattens
    if name is None:
        return None
    return (
        f"channels_last: the inputs and activations only; {name} keeps the parameters contiguous "
        "(it flattens and broadcasts them as plain memory)"
    )


def buffers_change(setup: Setup, has_float_buffers: bool) -> str | None:
    """Why the model's floating-point buffers take the run's 16-bit precision (None: they stay).

    FSDP2's MixedPrecisionPolicy casts the parameters for compute and leaves buffers alone, and
    BatchNorm's backward wants its running statistics in its weights' dtype ("Expected
    running_mean to have type BFloat16 but got Float", bncnn under fsdp2.yaml on an H200). The
    statistics then accumulate in 16 bits, as under DeepSpeed (whose buffer_dtype strategy.py sets).
    """
    if setup.kind != "FSDP" or setup.fsdp_version != 2 or setup.precision not in ("fp16", "bf16"):
        return None
    if not has_float_buffers:
        return None
    return (
        f"{setup.precision} under FSDP2: the model's buffers (BatchNorm's running statistics) in {setup.precision} "
        "too, since FSDP2 casts only the parameters and BatchNorm's backward needs both alike"
    )


@dataclass(frozen=True)
class CopyPrecision:
    """How a throwaway copy of the model (prewarm's, the memory probe's) computes as the prepared model does."""

    weights: str | None  # "fp16"/"bf16": the copy's weights and buffers take it; None: they stay as they are
    autocast: bool  # its forward runs under the Accelerator's autocast (a no-op where the Accelerator has none)


AS_PREPARED_ELSEWHERE = CopyPrecision(None, autocast=True)  # one process and DDP: fp32 weights under autocast


def copy_precision(kind: str, precision: str, fsdp_version: int = 0) -> CopyPrecision:
    """The CopyPrecision under a DistributedType name, precision and FSDP version (Accelerate 1.15).

    DeepSpeed casts the weights to 16 bits and runs no autocast. FSDP computes with 16-bit copies of
    its fp32 weights: FSDP1's forward is wrapped in autocast by `prepare_model`, FSDP2's is not
    (`_prepare_fsdp2` never calls it), and FSDP2 keeps the buffers in 16 bits too (buffers_change).
    Elsewhere fp32 weights under autocast. A copy computed otherwise runs other kernels (prewarm then
    loads the wrong ones), keeps other activations (GroupNorm's fp32 outputs under autocast doubled
    the probe's prediction for FSDP2), or fails where dtypes meet ("Expected running_mean to have type
    Float but got BFloat16": an fp32 copy beside FSDP2's 16-bit BatchNorm buffers).
    """
    sixteen = precision if precision in SIXTEEN_BIT else None
    if kind == "DEEPSPEED":
        return CopyPrecision(sixteen, autocast=False)
    if kind == "FSDP":
        return CopyPrecision(sixteen, autocast=fsdp_version != 2)
    return AS_PREPARED_ELSEWHERE


def float_buffers(model: Any) -> bool:
    """Whether `model` (an nn.Module) holds floating-point buffers."""
    return any(buffer.is_floating_point() for buffer in model.buffers())


def cast_float_buffers(model: Any, dtype: Any) -> None:
    """Every floating-point buffer of `model` in `dtype`, registered as before."""
    for module in model.modules():
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer.is_floating_point():
                setattr(module, name, buffer.to(dtype))


CAPTURABLE_OPTIMIZERS = ("Adam", "AdamW")


def capture_refusal(setup: Setup, config: Any, optimizer_name: str) -> str | None:
    """Why this run cannot capture its step as a CUDA graph (None: it can). `optimizer_name`:
    the class name of the torch optimizer the step runs (torch's own Adam and AdamW capture)."""
    if setup.device != "cuda":
        return f"the device is {setup.device}; CUDA graphs need a CUDA GPU"
    if setup.kind not in ("NO", "MULTI_GPU"):
        return f"{setup.kind} is not captured here (one process or DDP only)"
    if setup.grad_accum > 1:
        return "gradient accumulation (more than one micro-batch per step) is not captured"
    if config.max_grad_norm is not None:
        return "max_grad_norm: gradient clipping is not captured"
    if setup.scaler:
        return "fp16's grad scaler checks the gradients on the host each step; use bf16 or no mixed precision"
    if setup.precision == "fp8":
        return "fp8 layers are not captured here"
    if setup.dynamo != "no":
        return f"torch.compile (dynamo_backend {setup.dynamo}) is not captured here (its reduce-overhead mode captures)"
    if optimizer_name not in CAPTURABLE_OPTIMIZERS:
        return f"optimizer {optimizer_name}: only torch's Adam and AdamW step from a device learning rate"
    if config.scheduler == "onecycle" and config.cycle_momentum:
        return (
            "onecycle's cycle_momentum sets Adam's beta1 anew every step, and a captured step would keep the "
            "first one; set cycle_momentum: false to capture"
        )
    return None


def eager_line(reason: str) -> str:
    """The line a run prints, and results.json's `changes` keeps, when it asked for capture and runs eagerly."""
    return f"cuda_graph: eager step: {reason}"


def tell_change(accelerator: Any, changes: list[str], line: str) -> None:
    """Print a change to what the config asked for (main process) and keep it for results.json."""
    accelerator.print(line)
    changes.append(line)
