"""TORCH_CUDA_ARCH_LIST for the ops DeepSpeed compiles while a run starts (FusedAdam for a
JSON's own Adam, CPUAdam under optimizer offload, DeepCompile, and others).

DeepSpeed builds such an op for the architectures TORCH_CUDA_ARCH_LIST names, and its op builder
reads each entry as two integers: an architecture-specific entry such as `9.0a` (Hopper; PyTorch
2.11 accepts them) stops it with `ValueError: invalid literal for int() with base 10: '0a'`
(DeepSpeed 0.19.8; DeepSpeed PR #8619, pytorch#144037;
docs/measurements.md#distributeddeepspeed_opspy). Where the variable is unset, or holds a value the
builder cannot read, it is set here, in every process and before DeepSpeed starts, to the visible
GPUs' compute capabilities, and said once. Whether DeepSpeed can read a value is asked of
DeepSpeed's own builder, the way it parses one when it builds, so that a DeepSpeed that learns the
suffixes is no longer second-guessed.
"""

from __future__ import annotations

import os

from ..errors import one_line

VARIABLE = "TORCH_CUDA_ARCH_LIST"


def deepspeed_arch_problem(arch_list: str) -> str | None:
    """Why DeepSpeed's op builder cannot read `arch_list` as it would when compiling an op in
    this process (None: it can). The environment is left as it was."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    saved = os.environ.get(VARIABLE)
    builder = FusedAdamBuilder()
    builder.jit_mode = True  # as jit_load sets it: the arch list is read, no device is probed
    os.environ[VARIABLE] = arch_list
    try:
        builder.compute_capability_args()
    except (ValueError, IndexError, RuntimeError) as e:
        return one_line(e)
    finally:  # compute_capability_args rewrites the variable with what it parsed
        if saved is None:
            os.environ.pop(VARIABLE, None)
        else:
            os.environ[VARIABLE] = saved
    return None


def visible_capabilities() -> str:
    """The compute capabilities of the visible CUDA devices, as TORCH_CUDA_ARCH_LIST writes them."""
    import torch

    found = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in found)


def align_cuda_arch_list(uses_deepspeed: bool) -> str | None:
    """Make TORCH_CUDA_ARCH_LIST one DeepSpeed's op builder can read, in this process; returns what
    to tell the user (once), or None where nothing was changed.

    Unset, it is set to the visible GPUs' compute capabilities. Set to a value the builder cannot
    read (an architecture-specific entry such as `9.0a`), it is replaced the same way and the note
    names both values: kept, it would stop the first op DeepSpeed compiles with a traceback mid-run.
    """
    import torch

    if not uses_deepspeed or not torch.cuda.is_available():
        return None
    current = os.environ.get(VARIABLE, "").strip()
    problem = deepspeed_arch_problem(current) if current else None
    if current and problem is None:
        return None
    wanted = visible_capabilities()
    if deepspeed_arch_problem(wanted) is not None:  # a DeepSpeed that cannot read plain X.Y either
        return None
    os.environ[VARIABLE] = wanted
    if current:
        return (
            f"{VARIABLE}={current} cannot be read by DeepSpeed's op builder ({problem}): set to {wanted} (the "
            f"visible GPUs' compute capabilities) for this run; export {VARIABLE}={wanted} to make it yours"
        )
    return (
        f"{VARIABLE} was unset: set to {wanted} (the visible GPUs' compute capabilities) for the ops "
        "DeepSpeed compiles, whose op builder stops at entries such as 9.0a"
    )
