"""examples/notebook_launch.py starts its two CPU processes as a user would run it, and
examples/core_loop.py, the base example, trains under one process and under DeepSpeed ZeRO-2 (its
FSDP2 run is in tests/gpu/test_examples.py)."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import CONFIGS, REPO, console_script, free_port, run_command, run_example


@pytest.mark.slow
def test_notebook_launch_on_two_cpu_processes(tmp_path, mnist_dir):
    out = run_example("notebook_launch.py", "--max-steps", "20", "--output-dir", str(tmp_path / "run"),
                      "--port", str(free_port()))  # fmt: skip
    assert "MULTI_CPU on 2 processes" in out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (results["num_processes"], results["steps"], results["global_batch_size"]) == (2, 20, 128)


# Measured on a 2-core CPU, 30 steps of batch 64 per process: 0.83 alone, 0.84 under ZeRO-2 on two
# processes (chance is 0.10).
CORE_LOOP_LAUNCHES = {
    "cpu": (["--config_file", str(CONFIGS / "cpu.yaml")], "NO on 1 process(es)"),
    "zero2": (
        ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no", "--num_processes", "2"],
        "DEEPSPEED on 2 process(es)",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CORE_LOOP_LAUNCHES))
@pytest.mark.usefixtures("mnist_dir")
def test_core_loop_example_trains_under_the_launch_s_strategy(case):
    launch, setup = CORE_LOOP_LAUNCHES[case]
    cmd = [console_script("accelerate"), "launch", *launch, "--main_process_port", "0",
           str(REPO / "examples" / "core_loop.py"), "--max-steps", "30"]  # fmt: skip
    proc = run_command(cmd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = re.search(r"^(.+): steps 30 test_accuracy ([0-9.]+)$", proc.stdout, re.MULTILINE)
    assert found, proc.stdout[-2000:]
    assert found[1] == setup
    assert float(found[2]) > 0.6
