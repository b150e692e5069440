"""FSDP asked for without a launcher, on a machine without a GPU: one error line."""

from __future__ import annotations

import pytest
from accelerate.utils import is_cuda_available

from accel_mnist.distributed.strategy_checks import FSDP_NEEDS_A_DEVICE
from tests.helpers import run_accel_mnist

no_gpu_only = pytest.mark.skipif(is_cuda_available(), reason="about machines without a GPU")


@no_gpu_only
def test_fsdp_env_without_a_launcher_is_one_error_line(tmp_path):
    out = tmp_path / "run"
    proc = run_accel_mnist("train", "--model", "linear", "--max-steps", "2", "--output-dir", str(out),
                env={"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"})  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [f"error: {FSDP_NEEDS_A_DEVICE}"]
    assert not out.exists()
