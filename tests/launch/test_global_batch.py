"""`--global-batch-size` under launches: the accumulation the memory plan chooses after the Accelerator
exists reaches DDP's accumulate and DeepSpeed's engine (whose batch settings must multiply out), and
config.json records the micro-batch and accumulation that ran. The GPU's fit is stubbed
(global_batch_script.py); tests/gpu/test_peak.py asks the real probe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, REPO

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("global_batch_script.py")


@pytest.mark.parametrize(
    "launch, processes, micro, accumulation",
    [(["--config_file", str(CONFIGS / "zero2.yaml"), "--num_processes", "1", "--mixed_precision", "no"], 1, 32, 3),
     (["--config_file", str(CONFIGS / "multi_cpu.yaml")], 2, 24, 2)],
    ids=["zero2", "ddp"],
)  # fmt: skip
def test_a_global_batch_is_kept_by_the_accumulation_the_plan_chose(launch, processes, micro, accumulation, tmp_path):
    # 96 a step: 32 fit, so 3 micro-batches of 32 on one process; 48 per process on two, 2 of 24.
    out = tmp_path / "run"
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", *launch, "--main_process_port", "0", str(SCRIPT), str(out), "96"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads((out / "results.json").read_text())
    ran = json.loads((out / "config.json").read_text())
    assert (results["global_batch_size"], results["num_processes"], results["steps"]) == (96, processes, 4)
    assert (ran["batch_size"], ran["grad_accum"], ran["global_batch_size"]) == (micro, accumulation, None)
    assert f"global batch 96 as asked: {micro} per process x {accumulation} accumulation" in proc.stdout + proc.stderr
