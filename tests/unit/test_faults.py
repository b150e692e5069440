"""What a restart may resume: the global batch across another number of processes, and FSDP1
with offload; and a checkpoint's state, saved flat and split again."""

from __future__ import annotations

from pathlib import Path

import pytest

from accel_mnist.distributed.strategy import Strategy
from accel_mnist.errors import UsageError
from accel_mnist.training.state import Progress, RunDescription, check_compatible, read, rescale_loss_sums, saved


def _run(num_processes: int, batch_size: int, zero_stage: int = 0) -> tuple[Progress, RunDescription]:
    kind = "DEEPSPEED" if zero_stage else ("MULTI_CPU" if num_processes > 1 else "NO")
    progress = Progress(step=10, loss_sums=[3.0] * num_processes)
    described = RunDescription(
        strategy={"num_processes": num_processes, "zero_stage": zero_stage, "distributed_type": kind},
        config={"batch_size": batch_size, "grad_accum": 1, "model": "linear"},
    )  # fmt: skip
    return progress, described


def _check(was: tuple[Progress, RunDescription], now: RunDescription, config: dict | None = None) -> None:
    strategy = Strategy.from_fields(now.strategy)
    check_compatible(*was, strategy, config or now.config, Path("ck"), total_steps=40)


def test_another_number_of_processes_needs_the_same_global_batch():
    was = _run(2, 32)
    _, now = _run(1, 64)
    _check(was, now)  # 2 x 32 = 1 x 64
    assert rescale_loss_sums(was[0], 1) == [3.0]  # (3 + 3) / 2 ranks, carried by rank 0
    with pytest.raises(UsageError, match="global batch of 64 .* but this run has 32; with 1 processes pass "
                       "batch_size=64 to keep it"):  # fmt: skip
        _check(was, now, {**now.config, "batch_size": 32})
    with pytest.raises(UsageError, match="3 processes cannot keep it"):
        _check(was, _run(3, 32)[1])
    # ZeRO shards are converted to DeepSpeed's universal format on load (tests/launch/test_resume_elsewhere.py).
    _check(_run(2, 32, zero_stage=2), _run(1, 64, zero_stage=2)[1])


@pytest.mark.parametrize("version", [1, 2])
def test_fsdp1_with_offload_is_not_resumed(version):
    """Measured on an H200: FSDP1 resumed with CPU offload drifts (FULL and SHARDED alike); FSDP2's resumes."""
    fsdp = {"distributed_type": "FSDP", "fsdp_version": version, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_offload_params": True, "num_processes": 1, "zero_stage": 0}  # fmt: skip
    progress, described = _run(1, 64)
    described.strategy = fsdp
    if version == 2:
        _check((progress, described), described)
        return
    with pytest.raises(UsageError, match="resuming FSDP1 with fsdp_offload_params true is not exact"):
        _check((progress, described), described)
    described.strategy = {**fsdp, "fsdp_offload_params": False}
    _check((progress, described), described)


def test_a_checkpoints_state_is_saved_flat_and_split_again():
    """trainer_state.json stays one flat object (checkpoints of earlier versions resume); a field
    neither part knows, or one of the wrong kind, is refused in one line."""
    progress, described = _run(2, 32)
    progress.samples, described.class_names = 640, ["a", "b"]
    flat = saved(progress, described)
    assert flat["step"] == 10 and flat["class_names"] == ["a", "b"] and "progress" not in flat
    assert read(flat, Path("ck")) == (progress, described)
    assert read({"step": 3}, Path("ck")) == (Progress(step=3), RunDescription())
    assert read({}, Path("ck")) == (Progress(), RunDescription())  # every field left out takes its default
    with pytest.raises(
        UsageError, match=r"ck/trainer_state.json: unreadable checkpoint state \(unknown fields bogus\)"
    ):
        read({**flat, "bogus": 1}, Path("ck"))
