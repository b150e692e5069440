"""Model states per process on GPUs, in each accelerate config's own precision: measured against predicted
for one process and every strategy (offload and FSDP included), and halving on two GPUs."""

from __future__ import annotations

import pytest

from tests.helpers import CONFIGS, MNIST_DIR, accelerate_launch, real_mnist_present

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

TRAIN_ARGS = ["--model", "mlp", "--mlp-hidden", "4096,4096,4096", "--batch-size", "64", "--max-steps", "3",
              "--data-loader", "device", "--no-download", "--no-export", "--no-save-checkpoints",
              "--no-plots"]  # fmt: skip
KINDS = ("parameter_bytes", "gradient_bytes", "optimizer_state_bytes", "offloaded_bytes")
ONE_GPU = ["single_gpu", "multi_gpu", "zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "fsdp", "fsdp2"]


def _gpus(count: int) -> None:
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < count:
        pytest.skip(f"needs {count} CUDA GPU(s)")
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")


def _run(tmp_path, config: str, processes: int) -> dict:
    launch = ["--config_file", str(CONFIGS / f"{config}.yaml"), "--num_processes", str(processes),
              "--main_process_port", "0"]  # fmt: skip
    proc, results = accelerate_launch(launch, TRAIN_ARGS, tmp_path / f"{config}-{processes}")
    assert proc.returncode == 0, f"{config} x{processes} failed:\n{proc.stderr[-4000:]}"
    assert proc.stdout.strip().splitlines()[-1].startswith("model states per process"), proc.stdout[-2000:]
    return results["memory"]


def _close(measured: dict, predicted: dict) -> None:
    total = sum(predicted[k] for k in KINDS)
    for kind in KINDS:
        if predicted[kind]:
            assert measured[kind] == pytest.approx(predicted[kind], rel=0.05), (kind, measured, predicted)
        else:
            assert measured[kind] <= 0.01 * total, (kind, measured, predicted)


@pytest.mark.parametrize("config", ONE_GPU)
def test_one_gpu_measured_equals_predicted(tmp_path, config):
    _gpus(1)
    memory = _run(tmp_path, config, 1)
    [process] = memory["per_process"]
    assert process["peak_allocated_bytes"] >= sum(process[k] for k in KINDS[:3])
    assert process["peak_reserved_bytes"] >= process["peak_allocated_bytes"] and process["ooms"] == 0
    _close(process, memory["predicted"])


@pytest.mark.parametrize("config, halved", [
    ("zero1", ("optimizer_state_bytes",)),
    ("zero2", ("optimizer_state_bytes", "gradient_bytes")),
    ("zero3", ("optimizer_state_bytes", "gradient_bytes", "parameter_bytes")),
])  # fmt: skip
def test_two_gpus_hold_half_of_what_the_stage_partitions(tmp_path, config, halved):
    _gpus(2)
    one = _run(tmp_path, config, 1)["per_process"][0]
    two = _run(tmp_path, config, 2)
    for process in two["per_process"]:
        _close(process, two["predicted"])
        for kind in halved:
            assert process[kind] == pytest.approx(one[kind] / 2, rel=0.05), (kind, process, one)
