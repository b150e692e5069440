"""What a training option becomes under the strategy a launch set up: as asked, or changed with one line.

The runtime and the option matrix (tests/matrix.py) ask the same functions, so the table
in docs/strategies.md is what a run does. Each rule reads the run's `Strategy` (strategy.py),
taken from a live Accelerator (`Strategy.of`) or written down for a cell of the matrix.
Refusals of a whole launch (fp16 on a CPU, FSDP without a GPU) stay where the launch is
checked (launch/settings.py, accelerator.py, strategy_checks.py).
"""

from __future__ import annotations

from typing import Any

from ..precision import is_sixteen_bit
from .strategy import Strategy


def channels_last_change(strategy: Strategy) -> str | None:
    """Why channels-last stays off the parameters under this strategy (None: they take it too).

    DeepSpeed broadcasts each parameter as bytes (`p.data.view(torch.uint8)`, which needs a
    unit last stride) and flattens them into contiguous buffers; FSDP flattens or shards them
    along dim 0. The inputs still go channels-last, and a convolution with a channels-last input
    computes and returns channels-last activations (cuDNN and oneDNN pick the layout from either
    operand), so the kernels keep their layout; the weight is converted inside each convolution.
    """
    name = strategy.flattens
    if name is None:
        return None
    return (
        f"channels_last: the inputs and activations only; {name} keeps the parameters contiguous "
        "(it flattens and broadcasts them as plain memory)"
    )


def buffers_change(strategy: Strategy, has_float_buffers: bool) -> str | None:
    """Why the model's floating-point buffers take the run's 16-bit precision (None: they stay).

    FSDP2's MixedPrecisionPolicy casts the parameters for compute and leaves buffers alone, and
    BatchNorm's backward wants its running statistics in its weights' dtype ("Expected running_mean
    to have type BFloat16 but got Float"; docs/measurements.md#distributedoption_rulespy). The
    statistics then accumulate in 16 bits, as under DeepSpeed (whose buffer_dtype accelerator.py
    sets).
    """
    if strategy.kind != "FSDP" or strategy.fsdp_version != 2 or not is_sixteen_bit(strategy.precision):
        return None
    if not has_float_buffers:
        return None
    return (
        f"{strategy.precision} under FSDP2: the model's buffers (BatchNorm's running statistics) in "
        f"{strategy.precision} "
        "too, since FSDP2 casts only the parameters and BatchNorm's backward needs both alike"
    )


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


def capture_refusal(strategy: Strategy, config: Any, optimizer_name: str) -> str | None:
    """Why this run cannot capture its step as a CUDA graph (None: it can). `optimizer_name`:
    the class name of the torch optimizer the step runs (torch's own Adam and AdamW capture)."""
    if strategy.device != "cuda":
        return f"the device is {strategy.device}; CUDA graphs need a CUDA GPU"
    if strategy.kind not in ("NO", "MULTI_GPU"):
        return f"{strategy.kind} is not captured here (one process or DDP only)"
    if strategy.grad_accum > 1:
        return "gradient accumulation (more than one micro-batch per step) is not captured"
    if getattr(config, "global_batch_size", None) is not None:  # decided before the batch (memory_plan.py)
        return "global_batch_size may choose gradient accumulation, which is not captured"
    if config.max_grad_norm is not None:
        return "max_grad_norm: gradient clipping is not captured"
    if strategy.scaler:
        return "fp16's grad scaler checks the gradients on the host each step; use bf16 or no mixed precision"
    if strategy.precision == "fp8":
        return "fp8 layers are not captured here"
    if strategy.dynamo != "no" and (why := _compiled_capture_refusal(strategy)):
        return why
    if optimizer_name not in CAPTURABLE_OPTIMIZERS:
        return f"optimizer {optimizer_name}: only torch's Adam and AdamW step from a device learning rate"
    if config.scheduler == "onecycle" and config.cycle_momentum:
        return (
            "onecycle's cycle_momentum sets Adam's beta1 anew every step, and a captured step would keep the "
            "first one; set cycle_momentum: false to capture"
        )
    return None


# Backends whose compiled step is plain kernel launches, which the project's own capture records (inductor:
# Triton and cuDNN/cuBLAS kernels); "cudagraphs" and the vendor backends are not.
CAPTURED_DYNAMO_BACKENDS = ("inductor", "aot_eager", "eager")
# torch.compile modes that record CUDA graphs of their own (CUDA graph trees): one capture inside another fails.
OWN_GRAPH_MODES = ("reduce-overhead", "max-autotune")


def _compiled_capture_refusal(strategy: Strategy) -> str | None:
    """Why a torch.compile'd model's step cannot be captured whole (None: it can)."""
    backend, mode = strategy.dynamo, strategy.dynamo_mode
    if backend not in CAPTURED_DYNAMO_BACKENDS:
        captured = ", ".join(CAPTURED_DYNAMO_BACKENDS)
        return f"torch.compile with dynamo_backend {backend} is not captured here ({captured} are)"
    if mode in OWN_GRAPH_MODES:
        return (
            f"torch.compile's mode {mode} records CUDA graphs of its own; use mode default or "
            "max-autotune-no-cudagraphs (ACCELERATE_DYNAMO_MODE) to capture the whole step"
        )
    if strategy.kind != "NO":
        return "torch.compile under DDP is not captured here (one process only)"
    return None


def eager_line(reason: str) -> str:
    """The line a run prints, and results.json's `changes` keeps, when it asked for capture and runs eagerly."""
    return f"cuda_graph: eager step: {reason}"


def tell_change(accelerator: Any, changes: list[str], line: str) -> None:
    """Print a change to what the config asked for (main process) and keep it for results.json."""
    accelerator.print(line)
    changes.append(line)


def averaging_refusal(strategy: Strategy) -> str | None:
    """Why `ema_decay` cannot run under this strategy (None: it can). The average (training/averaging.py) is
    taken of each process's whole parameters and stands in for them at evaluations. ZeRO-3 leaves empty
    placeholders in the module between passes; FSDP's sharded parameters would take a sharded average that no
    test has run (FSDP needs a GPU), so it is refused until one has."""
    if strategy.kind == "DEEPSPEED" and strategy.zero_stage == 3:
        return "ema_decay: DeepSpeed ZeRO-3 shards the parameters, and the average needs them whole on each process"
    if strategy.kind == "FSDP":
        return f"ema_decay: FSDP{strategy.fsdp_version} shards the parameters; the average is not supported there yet"
    return None
