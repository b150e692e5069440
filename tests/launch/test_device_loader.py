"""DeviceLoader outside Accelerate's prepare, under a two-process DeepSpeed ZeRO-2 launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, REPO


@pytest.mark.slow
def test_outside_prepare_under_two_process_deepspeed_zero2(mnist_dir):
    """prepare(model, optimizer) without a dataloader + DeviceLoader: ZeRO-2 trains, syncs at
    the epoch end under accumulation, and both evaluation paths count 10000 test images."""
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", "--config_file", str(CONFIGS / "zero2.yaml"),
           "--num_processes", "2", "--mixed_precision", "no", "-m", "benchmarks.device_loader_check",
           "--steps", "4", "--grad-accum", "2", "--eval-batch-size", "333", "--data-dir", str(mnist_dir)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    report = json.loads(lines[-1])
    assert report["distributed_type"] == "DEEPSPEED" and report["num_processes"] == 2 and report["zero_stage"] == 2
    assert all(report["checks"].values()), report["checks"]
    assert report["gather_count"] == 10000
