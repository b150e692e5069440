"""examples/deepspeed/: the seed's setup under DeepSpeed's own launcher, run as a user would.

On the CPU with the seed's JSON in fp32 (ds_config_cpu.json); on a GPU with the seed's JSON as
it stands (fp16, ZeRO-2, train_batch_size 64).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from accel_mnist.launch.launchers import free_port
from tests.helpers import MNIST_DIR, REPO, console_script, real_mnist_present

SCRIPT = REPO / "examples" / "deepspeed" / "train.sh"


@pytest.fixture
def need_mnist():
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")


def run_script(out: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    full_env.update(ACCEL_MNIST_DATA_DIR=str(MNIST_DIR), OMP_NUM_THREADS="1", MASTER_PORT=str(free_port()),
                    DEEPSPEED=console_script("deepspeed"), **env)  # fmt: skip
    cmd = ["bash", str(SCRIPT), *args, "--output-dir", str(out), "--no-plots"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=full_env, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc, json.loads((out / "results.json").read_text())


def test_the_seed_json_is_the_seed_posts_config():
    seed = {"train_batch_size": 64, "gradient_accumulation_steps": 1, "fp16": {"enabled": True},
            "zero_optimization": {"stage": 2}}  # fmt: skip  # ds_config in the blog post, as written there
    cpu = json.loads((SCRIPT.parent / "ds_config_cpu.json").read_text())
    assert json.loads((SCRIPT.parent / "ds_config.json").read_text()) == seed
    assert cpu == {**seed, "fp16": {"enabled": False}}


@pytest.mark.slow
def test_seed_setup_on_the_cpu(tmp_path, need_mnist):
    cpu_json = "examples/deepspeed/ds_config_cpu.json"
    proc, results = run_script(tmp_path / "run", "--max-steps", "60", "--eval-every", "0", DS_CONFIG=cpu_json)
    assert "strategy: DeepSpeed ZeRO-2; precision: fp32; world size: 1; device: cpu" in proc.stdout
    assert (results["model"], results["distributed_type"], results["zero_stage"]) == ("linear", "DEEPSPEED", 2)
    assert (results["num_processes"], results["global_batch_size"], results["steps"]) == (1, 64, 60)
    assert "train_batch_size" not in proc.stderr  # the JSON's 64 is the run's global batch: nothing to say
    assert results["test_accuracy"] > 0.7  # Adam 3e-4 after 60 steps; an untrained model scores about 0.1
    assert (tmp_path / "run" / "model.safetensors").is_file()


@pytest.mark.gpu
def test_seed_setup_on_one_gpu(tmp_path, need_mnist):
    """The post's config unchanged: fp16, ZeRO-2, batch 64, one epoch of its linear model."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    proc, results = run_script(tmp_path / "run", "--epochs", "1")
    assert "strategy: DeepSpeed ZeRO-2; precision: fp16; world size: 1; device: cuda" in proc.stdout
    assert (results["distributed_type"], results["zero_stage"], results["mixed_precision"]) == ("DEEPSPEED", 2, "fp16")
    assert (results["num_processes"], results["global_batch_size"], results["steps"]) == (1, 64, 938)
    assert results["test_accuracy"] > 0.85  # one epoch of Adam 3e-4 on the linear model
