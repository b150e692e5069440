"""Launcher and accelerate-config settings are honoured or refused, never dropped in silence;
every refusal comes before the output directory exists. Here: through `accelerate launch`."""

from __future__ import annotations

import pytest

from tests.helpers import CONFIGS, QUICK_TRAIN_ARGS, WIZARD_MULTI_CPU, accelerate_launch


@pytest.mark.slow
def test_launch_flag_grad_accum_outside_deepspeed(tmp_path, mnist_dir):
    """accelerate launch parses --gradient_accumulation_steps and drops it outside DeepSpeed;
    accel_mnist reads it from the launcher's command line."""
    launch = ["--config_file", str(CONFIGS / "cpu.yaml"), "--gradient_accumulation_steps", "4"]
    proc, results = accelerate_launch(launch, QUICK_TRAIN_ARGS, tmp_path / "unset")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["global_batch_size"] == 64 * 4 and "grad_accum" not in proc.stderr
    proc, results = accelerate_launch(launch, [*QUICK_TRAIN_ARGS, "--grad-accum", "2"], tmp_path / "set")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["global_batch_size"] == 64 * 2
    assert proc.stderr.count("accelerate launch --gradient_accumulation_steps is 4") == 1, proc.stderr[-3000:]
    assert "using grad_accum=2" in proc.stderr


@pytest.mark.slow
def test_wizard_multi_cpu_that_starts_one_process_is_refused(tmp_path, mnist_dir):
    config = tmp_path / "multi_cpu_wizard.yaml"
    config.write_text(WIZARD_MULTI_CPU)
    out = tmp_path / "never" / "run"
    proc, _ = accelerate_launch(["--config_file", str(config)], QUICK_TRAIN_ARGS, out)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "asks for 2 processes (distributed_type: MULTI_CPU)" in errors[0], proc.stderr
    assert "accelerate_configs/multi_cpu.yaml" in errors[0] and "mpirun" in errors[0]
    assert not (tmp_path / "never").exists()
