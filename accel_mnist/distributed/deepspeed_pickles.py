"""The DeepSpeed types its ZeRO checkpoints pickle, for the allow-list of run/safe_load.py.

Seen with DeepSpeed 0.19.8, fp32 and bf16, stages 1-3; the loss scalers under fp16. Nothing else
of DeepSpeed's is unpickled from a checkpoint unless the user trusts it (--trust-checkpoint).
"""

from __future__ import annotations

from typing import Any


def pickled_types() -> list[Any]:
    """The classes and functions a ZeRO checkpoint names besides torch's and numpy's."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]
