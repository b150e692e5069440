"""A DeepSpeed JSON with its own optimizer and scheduler sections (DeepSpeedExamples style).

DeepSpeed must build and step the JSON's optimizer and schedule (Accelerate's DummyOptim /
DummyScheduler), their "auto" values come from the training config, and checkpoint + resume
stays exact with them. Here: launches on 1 and 2 CPU processes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from accel_mnist.run import checkpoint as ckpt
from tests.helpers import (
    CONFIGS,
    DS_ADAM,
    DS_DECAY,
    DS_SGD,
    accelerate_launch,
    metrics_rows,
    warmup_decay_lr,
    write_ds_config,
)

TRAIN = ["--model", "mlp", "--max-steps", "24", "--eval-every", "6", "--no-download", "--no-export",
         "--no-save-checkpoints", "--data-loader", "device"]  # fmt: skip


@pytest.mark.slow
def test_json_sgd_is_the_optimizer_that_trains(tmp_path, mnist_dir):
    """The JSON's SGD (lr 0.05, momentum auto = 0.9) trains exactly like the training config's SGD."""
    json_yaml = write_ds_config(tmp_path, "sgd", 1, optimizer=DS_SGD)
    proc, _ = accelerate_launch(["--config_file", str(json_yaml), "--mixed_precision", "no"], TRAIN, tmp_path / "a")
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Said once, on stderr: the JSON's optimizer and lr win over the config's (default adam, 1e-3).
    assert proc.stderr.count("DeepSpeed JSON's own settings win") == 1, proc.stderr[-3000:]
    plain = ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no", "--num_processes", "1"]
    proc, _ = accelerate_launch(plain, [*TRAIN, "--optimizer", "sgd", "--lr", "0.05"], tmp_path / "b")
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc, _ = accelerate_launch(plain, TRAIN, tmp_path / "adam")  # the config's default: Adam, 1e-3
    assert proc.returncode == 0, proc.stderr[-3000:]
    json_sgd, torch_sgd, adam = (
        metrics_rows(tmp_path / "a"),
        metrics_rows(tmp_path / "b"),
        metrics_rows(tmp_path / "adam"),
    )
    assert [r["lr"] for r in json_sgd] == [0.05] * 4
    for a, b in zip(json_sgd, torch_sgd, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-6)
        assert a["test_loss"] == pytest.approx(b["test_loss"], rel=1e-6)
    assert all(abs(a["test_loss"] - b["test_loss"]) > 1e-3 for a, b in zip(json_sgd, adam, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("num_processes", [1, 2])
def test_json_schedule_sets_the_lr(tmp_path, mnist_dir, num_processes):
    yaml_file = write_ds_config(tmp_path, "decay", num_processes, optimizer=DS_ADAM, scheduler=DS_DECAY)
    launch = ["--config_file", str(yaml_file), "--mixed_precision", "no"]
    proc, results = accelerate_launch(launch, [*TRAIN, "--lr", "2e-3"], tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["num_processes"] == num_processes and results["zero_stage"] == 2
    got = metrics_rows(tmp_path / "out")
    assert [r["step"] for r in got] == [6, 12, 18, 24]
    # total_num_steps "auto" = the run's 24 optimizer steps; warmup_max_lr "auto" = --lr.
    want = [warmup_decay_lr(r["step"], 2e-3, 8, 24) for r in got]
    assert [r["lr"] for r in got] == pytest.approx(want, rel=1e-9)
    assert got[-1]["test_accuracy"] > 0.5


@pytest.mark.slow
def test_resume_with_json_optimizer_and_schedule_is_exact(tmp_path, mnist_dir):
    """Two processes, the JSON's Adam + WarmupDecayLR: resuming from the step-12 checkpoint gives
    the metrics and weights of the run that never stopped."""
    yaml_file = write_ds_config(tmp_path, "decay", 2, optimizer=DS_ADAM, scheduler=DS_DECAY)
    launch = ["--config_file", str(yaml_file), "--mixed_precision", "no"]
    args = [a for a in TRAIN if a != "--no-save-checkpoints"] + ["--checkpoint-every", "12", "--keep-checkpoints", "3"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    proc, _ = accelerate_launch(launch, args, whole)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [p.name for p in ckpt.list_checkpoints(whole)] == ["step_12", "step_24"]
    # The state a run killed right after its step-12 checkpoint leaves behind.
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / "step_24")
    (resumed / "results.json").unlink()
    proc, _ = accelerate_launch(launch, [*args, "--resume-from", "latest"], resumed)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    assert metrics_rows(resumed) == metrics_rows(whole)
    a, b = (_model_states(d / "checkpoints" / "step_24") for d in (whole, resumed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _model_states(checkpoint: Path) -> dict[str, torch.Tensor]:
    files = sorted(checkpoint.glob("**/*model_states.pt"))
    assert files, f"no DeepSpeed model states in {checkpoint}"
    # A checkpoint this test just wrote; DeepSpeed stores its own objects beside the weights.
    return torch.load(files[0], map_location="cpu", weights_only=False)["module"]
