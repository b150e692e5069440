"""What a restart may resume: the global batch across another number of processes, and FSDP1
with offload."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel_mnist.distributed.strategy import Strategy
from accel_mnist.errors import UsageError
from accel_mnist.run import checkpoint as ckpt


def _state(num_processes: int, batch_size: int, zero_stage: int = 0) -> ckpt.TrainState:
    kind = "DEEPSPEED" if zero_stage else ("MULTI_CPU" if num_processes > 1 else "NO")
    return ckpt.TrainState(
        step=10, strategy={"num_processes": num_processes, "zero_stage": zero_stage, "distributed_type": kind},
        config={"batch_size": batch_size, "grad_accum": 1, "model": "linear"},
        loss_sums=[3.0] * num_processes,
    )  # fmt: skip


def test_another_number_of_processes_needs_the_same_global_batch():
    saved, where = _state(2, 32), Path("ck")
    now = _state(1, 64)
    ckpt.check_compatible(
        saved, Strategy.from_fields(now.strategy), now.config, where, total_steps=40
    )  # 2 x 32 = 1 x 64
    assert ckpt.rescale_loss_sums(saved, 1) == [3.0]  # (3 + 3) / 2 ranks, carried by rank 0
    with pytest.raises(UsageError, match="global batch of 64 .* but this run has 32; with 1 processes pass "
                       "--batch-size 64 to keep it"):  # fmt: skip
        ckpt.check_compatible(
            saved, Strategy.from_fields(now.strategy), {**now.config, "batch_size": 32}, where, total_steps=40
        )
    three = _state(3, 32)
    with pytest.raises(UsageError, match="3 processes cannot keep it"):
        ckpt.check_compatible(saved, Strategy.from_fields(three.strategy), three.config, where, total_steps=40)
    zero_saved, zero_now = _state(2, 32, zero_stage=2), _state(1, 64, zero_stage=2)
    # ZeRO shards are converted to DeepSpeed's universal format on load (tests/launch/test_resume_elsewhere.py).
    ckpt.check_compatible(zero_saved, Strategy.from_fields(zero_now.strategy), zero_now.config, where, total_steps=40)


@pytest.mark.parametrize("version", [1, 2])
def test_fsdp1_with_offload_is_not_resumed(version):
    """Measured on an H200: FSDP1 resumed with CPU offload drifts (FULL and SHARDED alike); FSDP2's resumes."""
    fsdp = {"distributed_type": "FSDP", "fsdp_version": version, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_offload_params": True, "num_processes": 1, "zero_stage": 0}  # fmt: skip
    saved = _state(1, 64)
    saved.strategy = fsdp
    check = lambda: ckpt.check_compatible(saved, Strategy.from_fields(fsdp), saved.config, Path("ck"), total_steps=40)  # noqa: E731
    if version == 2:
        check()
        return
    with pytest.raises(UsageError, match="resuming FSDP1 with fsdp_offload_params true is not exact"):
        check()
    check_without = {**fsdp, "fsdp_offload_params": False}
    saved.strategy = check_without
    ckpt.check_compatible(saved, Strategy.from_fields(check_without), saved.config, Path("ck"), total_steps=40)
