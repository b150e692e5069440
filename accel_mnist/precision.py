"""The precision policy in one home: which of Accelerate's mixed-precision names ("no", "fp16",
"bf16", "fp8") cast weights or buffers to 16 bits, to which dtype, and how many bytes a weight then
takes where DeepSpeed or FSDP keeps it. torch is imported only where a dtype is asked for: the
report's process (report/) reads the policy without importing torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SIXTEEN_BIT_NAMES = ("fp16", "bf16")  # the precisions that cast weights or buffers
FP32_BYTES = 4


def is_sixteen_bit(precision: str | None) -> bool:
    """Whether `precision` casts weights or buffers to 16 bits (fp16 or bf16)."""
    return precision in SIXTEEN_BIT_NAMES


def sixteen_bit_dtype(precision: str) -> torch.dtype:
    """The dtype a 16-bit `precision` casts to (torch.float16 for fp16, torch.bfloat16 for bf16)."""
    import torch

    return {"fp16": torch.float16, "bf16": torch.bfloat16}[precision]


def weight_bytes(precision: str | None) -> int:
    """Bytes of one parameter as DeepSpeed and FSDP keep it: 2 under fp16 and bf16, and under fp8 (whose
    weights stay in bf16 there), else 4."""
    return 2 if is_sixteen_bit(precision) or precision == "fp8" else FP32_BYTES
