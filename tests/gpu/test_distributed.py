"""The strategies' parity on GPUs: FSDP 1 and 2 against DDP and ZeRO-1/2/3, fp32, with the
arguments of the CPU parity runs (tests/launch/test_distributed.py)."""

from __future__ import annotations

import json

import pytest

from tests.helpers import CONFIGS, MNIST_DIR, PARITY_TRAIN_ARGS, accelerate_launch, real_mnist_present

# FSDP runs only on GPUs (accelerate 1.15 never sets it up on a CPU; see tests/unit/test_fsdp.py), so
# its parity is checked here: the same arguments, fp32, against DDP and ZeRO-3 on the same GPUs.
GPU_STRATEGIES = {
    "ddp": ["--config_file", str(CONFIGS / "multi_gpu.yaml")],
    "zero1": ["--config_file", str(CONFIGS / "zero1.yaml")],
    "zero2": ["--config_file", str(CONFIGS / "zero2.yaml")],
    "zero3": ["--config_file", str(CONFIGS / "zero3.yaml")],
    "fsdp1": ["--config_file", str(CONFIGS / "fsdp.yaml")],
    "fsdp1_flat_params": ["--config_file", str(CONFIGS / "fsdp.yaml"), "--fsdp_use_orig_params", "false"],
    "fsdp2": ["--config_file", str(CONFIGS / "fsdp2.yaml")],
}


@pytest.mark.slow
@pytest.mark.gpu
@pytest.mark.parametrize("processes", [1, 2])
def test_fsdp_matches_ddp_and_zero3_on_gpus(processes, tmp_path):
    import torch
    from accelerate.utils import is_cuda_available

    if not is_cuda_available() or torch.cuda.device_count() < processes:
        pytest.skip(f"needs {processes} CUDA GPU(s)")
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    rows = {}
    for name, launch_args in GPU_STRATEGIES.items():
        launch = [*launch_args, "--num_processes", str(processes), "--mixed_precision", "no"]
        launch += ["--main_process_port", "0"]
        proc, results = accelerate_launch(launch, [*PARITY_TRAIN_ARGS, "--data-loader", "device"], tmp_path / name)
        assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-4000:]}"
        assert results["num_processes"] == processes and results["steps"] == 30
        assert results["distributed_type"] == (
            "MULTI_GPU" if name == "ddp" else "DEEPSPEED" if "zero" in name else "FSDP"
        )
        rows[name] = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    # The gaps, for the record (pytest -s shows them): largest relative difference from DDP.
    for name in rows:
        gaps = {
            k: max(abs(r[k] - d[k]) / abs(d[k]) for r, d in zip(rows[name], rows["ddp"], strict=True))
            for k in ("train_loss", "test_loss")
        }
        print(f"parity {processes} GPU(s) {name}: " + ", ".join(f"{k} {v:.2e}" for k, v in gaps.items()))
    for name in ("zero1", "zero2", "zero3", "fsdp1", "fsdp1_flat_params", "fsdp2"):
        for ddp_row, row in zip(rows["ddp"], rows[name], strict=True):
            assert row["step"] == ddp_row["step"]
            assert row["lr"] == pytest.approx(ddp_row["lr"], rel=1e-6)
            for key in ("train_loss", "test_loss"):
                assert row[key] == pytest.approx(ddp_row[key], rel=2e-4), (name, key)
            assert row["test_accuracy"] == pytest.approx(ddp_row["test_accuracy"], abs=1e-3), name
