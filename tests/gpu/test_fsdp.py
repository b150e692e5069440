"""FSDP (1 and 2) and torch dynamo on a GPU: train, checkpoint, resume and export (accelerate 1.15
never sets FSDP up on a CPU: tests/unit/test_fsdp.py)."""

from __future__ import annotations

import shutil
import signal
from pathlib import Path

import pytest
import torch
from accelerate.utils import is_cuda_available
from safetensors.torch import load_file

from accel_mnist.run.checkpoint_weights import FSDP_FULL, FSDP_SHARDED
from tests.helpers import CONFIGS, accelerate_launch, preempt_and_resume, run_accel_mnist

requires_gpu = pytest.mark.skipif(not is_cuda_available(), reason="needs a CUDA GPU")


def _keys(file: Path) -> list[str]:
    return list(load_file(file).keys())


# One process on one GPU (more with --num_processes where there are more GPUs). Accumulation,
# clipping and a schedule are on, as in the parity test.
GPU_ARGS = ["--model", "mlp", "--batch-size", "32", "--grad-accum", "2", "--max-grad-norm", "0.5",
            "--scheduler", "onecycle", "--lr", "2e-3", "--max-steps", "40", "--eval-every", "20",
            "--checkpoint-every", "20", "--keep-checkpoints", "2", "--no-download"]  # fmt: skip
GPU_CASES = {
    "fsdp1": ["--config_file", str(CONFIGS / "fsdp.yaml")],
    "fsdp1_flat_params": ["--config_file", str(CONFIGS / "fsdp.yaml"), "--fsdp_use_orig_params", "false"],
    "fsdp1_full": ["--config_file", str(CONFIGS / "fsdp.yaml"), "--fsdp_state_dict_type", "FULL_STATE_DICT"],
    "fsdp2": ["--config_file", str(CONFIGS / "fsdp2.yaml")],
    "fsdp2_full": ["--config_file", str(CONFIGS / "fsdp2.yaml"), "--fsdp_state_dict_type", "FULL_STATE_DICT"],
    "fsdp2_offload": ["--config_file", str(CONFIGS / "fsdp2.yaml"), "--fsdp_offload_params", "true"],
    "fsdp1_offload": ["--config_file", str(CONFIGS / "fsdp.yaml"), "--fsdp_offload_params", "true"],
    "fsdp1_offload_full": [
        "--config_file",
        str(CONFIGS / "fsdp.yaml"),
        "--fsdp_offload_params",
        "true",
        "--fsdp_state_dict_type",
        "FULL_STATE_DICT",
    ],
}


# FSDP1's SHARDED_STATE_DICT resume once dropped Adam's state (Accelerate loads into the slots a
# fresh optimizer has: none); runtime.prepare(resuming=True) allocates them first.


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("case", list(GPU_CASES))
@pytest.mark.usefixtures("mnist_dir")
def test_fsdp_trains_checkpoints_resumes_and_exports_on_a_gpu(case, tmp_path):
    # bf16, as the YAMLs say; the parity test in tests/gpu/test_distributed.py runs FSDP in fp32.
    launch = [*GPU_CASES[case], "--num_processes", "1", "--main_process_port", "0"]
    whole = tmp_path / "whole"
    proc, results = accelerate_launch(launch, GPU_ARGS, whole)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["distributed_type"] == "FSDP" and results["fsdp_version"] == (2 if "fsdp2" in case else 1)
    assert results["test_accuracy"] > 0.7 and results["steps"] == 40
    full = "full" in case
    assert results["fsdp_state_dict_type"] == ("FULL_STATE_DICT" if full else "SHARDED_STATE_DICT")
    last = whole / "checkpoints" / "step_40"
    assert (last / (FSDP_FULL if full else FSDP_SHARDED)).exists()
    # The checkpoint's weights, exported, are the run's own export (both full fp32).
    proc = run_accel_mnist("export", "--checkpoint", str(last), "--output", str(tmp_path / "exported"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    live, exported = load_file(whole / "model.safetensors"), load_file(tmp_path / "exported" / "model.safetensors")
    assert live.keys() == exported.keys() and all(torch.equal(live[k], exported[k]) for k in live)
    # Resume from step 20 of a copy: the same steps again, and the same end.
    broken = tmp_path / "broken"
    shutil.copytree(whole, broken)
    shutil.rmtree(broken / "checkpoints" / "step_40")
    (broken / "results.json").unlink()
    proc, resumed = accelerate_launch(launch, [*GPU_ARGS, "--resume-from", "latest"], broken)
    if case.startswith("fsdp1_offload"):  # measured to drift (FULL and SHARDED alike): refused up front
        assert proc.returncode != 0 and "resuming FSDP1 with fsdp_offload_params true is not exact" in proc.stderr
        assert not (broken / "results.json").exists() and (broken / "checkpoints" / "step_20").is_dir()
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    again = load_file(broken / "model.safetensors")
    for key in live:
        torch.testing.assert_close(again[key], live[key], rtol=1e-5, atol=1e-6)
    assert resumed["test_loss"] == pytest.approx(results["test_loss"], rel=1e-5)


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("case", ["fsdp1", "fsdp2"])
@pytest.mark.usefixtures("mnist_dir")
def test_dynamo_under_fsdp_on_a_gpu(case, tmp_path):
    launch = [*GPU_CASES[case], "--num_processes", "1", "--dynamo_backend", "inductor", "--main_process_port", "0"]
    out = tmp_path / "run"
    proc, results = accelerate_launch(launch, GPU_ARGS, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["dynamo_backend"] == "inductor" and results["distributed_type"] == "FSDP"
    assert 0 < results["warmup_seconds"] <= results["train_seconds"]
    assert not [k for k in _keys(out / "model.safetensors") if "_orig_mod" in k]
    proc = run_accel_mnist(
        "export", "--checkpoint", str(out / "checkpoints" / "step_40"), "--output", str(tmp_path / "e")
    )
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.gpu
@requires_gpu
@pytest.mark.usefixtures("mnist_dir")
def test_dynamo_with_fsdp1_flat_params_is_refused_on_a_gpu(tmp_path):
    launch = [*GPU_CASES["fsdp1_flat_params"], "--num_processes", "1", "--dynamo_backend", "inductor"]
    launch += ["--main_process_port", "0"]
    proc, results = accelerate_launch(launch, GPU_ARGS, tmp_path / "run")
    assert results is None and "exitcode: 2" in proc.stderr
    assert "error: torch dynamo with FSDP1 needs fsdp_use_orig_params: true" in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.gpu
@requires_gpu
@pytest.mark.usefixtures("mnist_dir")
def test_sigterm_under_fsdp2_saves_and_resumes_exactly(tmp_path):
    """A preemption under FSDP2 (sharded state dict): the signal to the launcher saves the current
    step, and --resume-from auto ends with the uninterrupted run's metrics. 900 steps, where the
    CPU's fault tests take 120: a GPU finishes those before the signal lands."""
    launch = ["--config_file", str(CONFIGS / "fsdp2.yaml"), "--num_processes", "1", "--main_process_port", "0"]
    # The sharded checkpoints hold no safetensors file for same_weights to read: the metrics rows
    # (train and test loss at steps 60, 120, ...) compare the runs.
    preempt_and_resume(launch, tmp_path, signal.SIGTERM, "--max-steps", "900", steps=900, weights=False)
