"""`--profile N` on one GPU under one process, ZeRO-2 and FSDP2: each trains, writes its trace and
counts CUDA kernels and device time per step (the CPU runs: tests/e2e and tests/launch)."""

from __future__ import annotations

import json

import pytest
from accelerate.utils import is_cuda_available

from tests.helpers import CONFIGS, accelerate_launch

requires_gpu = pytest.mark.skipif(not is_cuda_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.usefixtures("mnist_dir")
@pytest.mark.parametrize("config", ["single_gpu.yaml", "zero2.yaml", "fsdp2.yaml"])
def test_a_profiled_gpu_run_counts_kernels_and_device_time(tmp_path, config):
    launch = ["--config_file", str(CONFIGS / config), "--num_processes", "1", "--main_process_port", "0"]
    out = tmp_path / "run"
    proc, results = accelerate_launch(launch, ["--model", "bncnn", "--max-steps", "12", "--profile", "5",
                                               "--no-save-checkpoints"], out, timeout=400)  # fmt: skip
    assert proc.returncode == 0 and results is not None, proc.stderr[-3000:]
    found = results["profile"]
    assert found["time"] == "device" and found["kernels_per_step"] > 10 and found["device_us_per_step"] > 0
    assert found["us_per_step"] > 0 and found["top"], found
    trace = json.loads((out / "profile" / "profile_0.json").read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])  # the GPU's own activity is in the trace
    assert "kernels a step" in proc.stdout
