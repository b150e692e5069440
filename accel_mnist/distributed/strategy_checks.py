"""What a launch asked for against what Accelerate set up, checked before any work.

Accelerate drops a strategy it cannot honour without a word (FSDP without an accelerator
becomes DDP or a world of one); these checks turn each such case into one UsageError.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelerate import Accelerator
from accelerate.utils import DistributedType

from ..errors import UsageError

if TYPE_CHECKING:
    from ..launch.launchers import DeepSpeedJson

FSDP_NEEDS_A_DEVICE = (
    "FSDP needs a GPU (or another accelerator Accelerate supports): without one, Accelerate 1.15 sets up "
    "DDP or single processes instead and FSDP1 refuses CPU tensors; on this machine use "
    "accelerate_configs/multi_cpu.yaml (DDP) or a zero*.yaml with --mixed_precision no (sharded, DeepSpeed)"
)


def multi_process_device_available() -> bool:
    """Whether Accelerate will find a device with a collective backend of its own for a torchrun launch.

    Asked through Accelerate's own device checks, in the order PartialState picks a backend
    (MPS has none, so several processes on a Mac run on the CPU over gloo).
    """
    import accelerate.utils

    # Each check only where this accelerate has it: accelerate 1.8 (the floor) knows neither
    # Neuron nor SDAA nor xccl.
    names = ("is_torch_xla_available", "is_mlu_available", "is_sdaa_available", "is_musa_available",
             "is_npu_available", "is_hpu_available", "is_cuda_available", "is_neuron_available")  # fmt: skip
    checks = [getattr(accelerate.utils, name, None) for name in names]
    if any(check is not None and check() for check in checks):
        return True
    # XPU needs a collective backend: xccl, or oneCCL's ccl in accelerate releases before xccl.
    xccl = getattr(accelerate.utils, "is_xccl_available", None) or accelerate.utils.is_ccl_available
    return bool(accelerate.utils.is_xpu_available() and xccl())


def check_strategy(
    accelerator: Accelerator,
    *,
    use_fsdp: bool,
    world_size: int,
    use_deepspeed: bool = False,
    deepspeed_json: DeepSpeedJson | None = None,
) -> None:
    """UsageError where Accelerate set up something else than the launch asked for, or fp16 on a
    CPU (`deepspeed_json`: the DeepSpeed config the launch found, to name where fp16 was asked)."""
    if accelerator.mixed_precision == "fp16" and accelerator.device.type == "cpu":
        raise UsageError(fp16_on_cpu(deepspeed_json))
    if use_deepspeed and accelerator.distributed_type != DistributedType.DEEPSPEED:
        raise UsageError(
            f"DeepSpeed was requested but Accelerate set up {accelerator.distributed_type.value}; "
            "an Accelerator created earlier in this process keeps its strategy (start a fresh process)"
        )
    if use_fsdp and accelerator.distributed_type != DistributedType.FSDP:
        raise UsageError(
            f"FSDP was requested (ACCELERATE_USE_FSDP) but Accelerate set up {accelerator.distributed_type.value}: "
            "start the run with `accelerate launch` (FSDP needs its launcher and a GPU)"
        )
    if accelerator.num_processes != world_size:
        raise UsageError(
            f"the launch started {world_size} processes but Accelerate joined {accelerator.num_processes} of "
            f"them ({accelerator.distributed_type.value} on {accelerator.device.type}); each would train alone"
        )
    _check_dynamo(accelerator)


def fp16_on_cpu(found: DeepSpeedJson | None) -> str:
    """The refusal of fp16 on a CPU, naming the place that asked for it."""
    fp16 = found.data.get("fp16") if found is not None and found.own else None
    if found is not None and isinstance(fp16, dict) and fp16.get("enabled") is True:
        return f'{found.label} enables fp16, which needs a GPU; on CPU set "fp16": {{"enabled": false}} there'
    return "mixed precision fp16 needs a GPU; on CPU launch with --mixed_precision no (or bf16)"


def _check_dynamo(accelerator: Accelerator) -> None:
    if _dynamo_backend(accelerator) == "no":
        return
    fsdp = accelerator.state.fsdp_plugin if accelerator.distributed_type == DistributedType.FSDP else None
    if fsdp is not None and fsdp.fsdp_version == 1 and not fsdp.use_orig_params:
        # torch 2.14 dynamo (variables/builder.py): "Dynamo only supports FSDP with use_orig_params=True".
        raise UsageError(
            "torch dynamo with FSDP1 needs fsdp_use_orig_params: true (or use fsdp_version: 2); "
            "this config has use_orig_params false"
        )


def _dynamo_backend(accelerator: Accelerator) -> str:
    return str(accelerator.state.dynamo_plugin.backend.value).lower()
