"""The scripts in examples/ run as a user would run them, with quick settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import MNIST_DIR, REPO

EXAMPLES = REPO / "examples"


def run_example(script, *args, timeout=300):
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=timeout)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.fixture
def need_mnist():
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")


def test_custom_model(tmp_path, need_mnist):
    out = run_example("custom_model.py", "--max-steps", "60", "--output-dir", str(tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model"] == "MyNet" and results["steps"] == 60
    assert results["num_parameters"] == 8 * 9 + 8 + 8 * 14 * 14 * 10 + 10
    assert results["test_accuracy"] > 0.8  # 0.90 after 100 steps, about 0.85 after 60
    assert f"test accuracy {results['test_accuracy']:.4f}" in out


def test_custom_dataset(tmp_path):
    out = run_example("custom_dataset.py", "--out", str(tmp_path / "stripes"), "--train-size", "2000",
                      "--test-size", "500", "--max-steps", "40", "--output-dir", str(tmp_path / "run"))  # fmt: skip
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["dataset"] == f"hf:{tmp_path / 'stripes'}" and results["steps"] == 40
    assert results["test_accuracy"] > 0.9 and "test accuracy" in out


@pytest.mark.slow
def test_notebook_launch_on_two_cpu_processes(tmp_path, need_mnist):
    out = run_example("notebook_launch.py", "--max-steps", "20", "--output-dir", str(tmp_path / "run"))
    assert "MULTI_CPU on 2 processes" in out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (results["num_processes"], results["steps"], results["global_batch_size"]) == (2, 20, 128)
