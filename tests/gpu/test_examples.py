"""examples/core_loop.py, the base example, under FSDP2 on one GPU, bf16 as fsdp2.yaml says (its CPU
runs, one process and DeepSpeed ZeRO-2, are in tests/launch/test_examples.py)."""

from __future__ import annotations

import re

import pytest
from accelerate.utils import is_cuda_available

from tests.helpers import CONFIGS, REPO, console_script, run_command

requires_gpu = pytest.mark.skipif(not is_cuda_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.usefixtures("mnist_dir")
def test_core_loop_example_trains_under_fsdp2_on_a_gpu():
    cmd = [console_script("accelerate"), "launch", "--config_file", str(CONFIGS / "fsdp2.yaml"),
           "--num_processes", "1", "--main_process_port", "0",
           str(REPO / "examples" / "core_loop.py"), "--max-steps", "30"]  # fmt: skip
    proc = run_command(cmd)
    assert proc.returncode == 0, proc.stderr[-4000:]
    found = re.search(r"^FSDP on 1 process\(es\): steps 30 test_accuracy ([0-9.]+)$", proc.stdout, re.MULTILINE)
    assert found, proc.stdout[-2000:]
    assert float(found[1]) > 0.6
