"""A transformers model (examples/transformers_model.py's small ViT) on two CPU processes under
DDP and DeepSpeed ZeRO-2: a run resumed from its step-10 checkpoint ends exactly as the
uninterrupted one, and transformers loads the export back (one process: tests/unit)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import CONFIGS, MNIST_DIR, REPO, metrics_rows

pytestmark = pytest.mark.slow
EXAMPLE = REPO / "examples" / "transformers_model.py"
STRATEGIES = {
    "ddp": (["--config_file", str(CONFIGS / "multi_cpu.yaml")], "MULTI_CPU", 0),
    "zero2": (["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"], "DEEPSPEED", 2),
}


def launch(launch_args, out, *args):
    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", *launch_args, str(EXAMPLE), "--max-steps", "20", "--checkpoint-every", "10",
           "--output-dir", str(out), *args]  # fmt: skip
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout, json.loads((out / "results.json").read_text()), metrics_rows(out)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_resumed_exactly_and_loaded_back_by_transformers(name, tmp_path, mnist_dir):
    from safetensors.torch import load_file
    from transformers import AutoModelForImageClassification

    launch_args, distributed_type, stage = STRATEGIES[name]
    out, whole, whole_rows = launch(launch_args, tmp_path / "whole")
    assert (whole["distributed_type"], whole["zero_stage"], whole["num_processes"]) == (distributed_type, stage, 2)
    assert whole["model"] == "ViTForImageClassification" and "same logits: True" in out
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "whole" / "checkpoints" / "step_10", resumed_dir / "checkpoints" / "step_10")
    _, resumed, resumed_rows = launch(launch_args, resumed_dir, "--resume-from", "latest")
    assert resumed_rows == whole_rows[1:]  # step 20, from the checkpoint of step 10
    for key in ("train_loss", "test_loss", "test_accuracy", "confusion_matrix"):
        assert resumed[key] == whole[key], key
    weights = load_file(tmp_path / "whole" / "model.safetensors")
    again = load_file(resumed_dir / "model.safetensors")
    assert weights.keys() == again.keys() and all(torch.equal(weights[k], again[k]) for k in weights)
    loaded = AutoModelForImageClassification.from_pretrained(resumed_dir / "hf")
    assert all(torch.equal(loaded.state_dict()[k], weights[k]) for k in weights)
