"""The training loop in one CPU process: on the real MNIST files where a result depends on them
(what a run learns, how many batches an epoch has), else on the synthetic ones."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

from accel_mnist import TrainConfig, train
from accel_mnist.run.outputs import CONFIG_FILE, METRICS_FILE, RESULTS_FILE

RESULT_KEYS = {
    "test_accuracy", "test_loss", "train_loss", "epochs", "steps", "samples_per_second",
    "train_seconds", "distributed_type", "num_processes", "zero_stage", "mixed_precision",
}  # fmt: skip
METRIC_KEYS = {"epoch", "step", "train_loss", "test_loss", "test_accuracy", "samples_per_second"}


def _config(data_dir, tmp_path):
    return TrainConfig(
        model="linear", data_dir=str(data_dir), download=False, output_dir=str(tmp_path / "run"),
        quiet=True, max_steps=60, eval_every=30, export=False,
    )  # fmt: skip


@pytest.fixture
def config(mnist_dir, tmp_path):
    return _config(mnist_dir, tmp_path)


@pytest.fixture
def small_config(synthetic_mnist, tmp_path):
    """The same run on the synthetic MNIST files: for what does not depend on the data."""
    return _config(synthetic_mnist, tmp_path)


def read_metrics(config):
    with open(f"{config.output_dir}/{METRICS_FILE}") as f:
        return [json.loads(line) for line in f]


def test_writes_results_metrics_and_config(small_config):
    results = train(small_config)
    out = small_config.output_dir
    on_disk = json.loads(open(f"{out}/{RESULTS_FILE}").read())
    assert RESULT_KEYS <= set(on_disk) and on_disk == json.loads(json.dumps(results))
    assert on_disk["steps"] == 60 and on_disk["zero_stage"] == 0 and on_disk["num_processes"] == 1
    rows = read_metrics(small_config)
    assert [r["step"] for r in rows] == [30, 60] and all(METRIC_KEYS <= set(r) for r in rows)
    assert rows[-1]["test_accuracy"] == results["test_accuracy"]
    # config.json is the config as it ran: the accumulation settled (the caller's config is left as given).
    saved = TrainConfig.from_dict(json.loads(open(f"{out}/{CONFIG_FILE}").read()))
    assert saved == small_config.replace(grad_accum=1) and small_config.grad_accum is None


def test_metrics_rows_and_results_name_the_same_peaks(small_config):
    """metrics.jsonl's peaks are results.json's per-process ones (the largest over the processes) under
    the same names and meanings: on a CPU no allocated peak in either, the RSS as peak_rss_bytes."""
    results = train(small_config.replace(max_steps=2, eval_every=0, save_checkpoints=False))
    [process] = results["memory"]["per_process"]
    last = read_metrics(small_config)[-1]
    assert process["peak_allocated_bytes"] is None and last["peak_allocated_bytes"] is None
    assert last["peak_rss_bytes"] == process["peak_rss_bytes"] > 0
    assert "peak_rss_bytes" not in results  # results.json states the peaks under memory only


def test_short_run_learns(config):
    # Measured: linear, batch 64, Adam 1e-3, 300 steps gives about 0.90; untrained is about 0.1.
    results = train(config.replace(max_steps=300, eval_every=0))
    assert results["test_accuracy"] >= 0.88
    assert results["train_loss"] < 0.6


def test_gradient_accumulation_matches_a_larger_batch(config):
    # Same shuffle (same seed, and 2 x 32 = 64 consecutive samples), mean of two half-batch
    # losses equals the full-batch loss: the two runs must end at the same weights.
    a = train(config.replace(batch_size=64, grad_accum=1, output_dir=config.output_dir + "_a"))
    b = train(config.replace(batch_size=32, grad_accum=2, output_dir=config.output_dir + "_b"))
    assert b["steps"] == a["steps"] == 60
    assert b["test_loss"] == pytest.approx(a["test_loss"], rel=1e-4)
    assert b["test_accuracy"] == pytest.approx(a["test_accuracy"], abs=2e-4)


def test_epoch_end_flushes_a_partial_accumulation(config):
    # 60000 / 64 = 937.5 -> 938 batches; with grad_accum 4 the last step has only 2 of them.
    results = train(config.replace(max_steps=None, epochs=1, grad_accum=4, eval_every=0, model="linear"))
    assert results["steps"] == math.ceil(938 / 4)
    assert results["epochs"] == 1.0


@pytest.mark.parametrize("scheduler, final_lr", [("cosine", 0.0), ("onecycle", 0.0), ("none", 1e-3)])
def test_schedules_reach_their_end(small_config, scheduler, final_lr):
    # The schedules are sized in optimizer steps, so max_steps ends them at their end
    # (onecycle's last value is 1e-3 / 25 / 1e4 annealed one step further, about 1e-6).
    train(small_config.replace(scheduler=scheduler))
    assert read_metrics(small_config)[-1]["lr"] == pytest.approx(final_lr, abs=2e-6)


def test_step_schedule_decays_per_epoch(config):
    # 2 epochs of 16 steps (max_steps cuts nothing); StepLR multiplies by gamma at each epoch.
    small = config.replace(max_steps=None, epochs=2, batch_size=4096, eval_every=0, step_gamma=0.5, scheduler="step")
    train(small)
    assert [r["lr"] for r in read_metrics(small)] == pytest.approx([5e-4, 2.5e-4])


def test_clipping_limits_the_update(config):
    sgd = config.replace(optimizer="sgd", lr=0.05, momentum=0.0, max_steps=20, eval_every=0)
    free = train(sgd.replace(output_dir=config.output_dir + "_free"))
    clipped = train(sgd.replace(max_grad_norm=1e-4, output_dir=config.output_dir + "_clip"))
    # 20 steps of length <= 0.05 * 1e-4 leave the untrained model's loss (about ln 10) in place.
    assert clipped["test_loss"] == pytest.approx(math.log(10), abs=0.1)
    assert free["test_loss"] < 1.0


def test_user_model(config):
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 4, 5, stride=3)
            self.fc = nn.Linear(4 * 8 * 8, 10)

        def forward(self, x):
            return self.fc(torch.relu(self.conv(x)).flatten(1))

    results = train(config.replace(max_steps=100, eval_every=0), model=Tiny())
    assert results["model"] == "Tiny" and results["test_accuracy"] > 0.5
    assert results["num_parameters"] == 4 * 25 + 4 + 256 * 10 + 10


def test_same_seed_same_result(small_config):
    a = train(small_config.replace(output_dir=small_config.output_dir + "_1"))
    b = train(small_config.replace(output_dir=small_config.output_dir + "_2"))
    assert a["test_loss"] == b["test_loss"] and a["train_loss"] == b["train_loss"]


def test_device_and_torch_data_paths_train_identically(small_config):
    # Same order (the device path reproduces the DataLoader's shuffle) and the same float ops:
    # the fast path must not change a single metric. mlp has dropout, and an evaluation
    # comes between training steps, so the paths must also use the global RNG alike.
    mlp = small_config.replace(model="mlp")
    device = train(mlp.replace(data_loader="device", output_dir=small_config.output_dir + "_device"))
    torch_ = train(mlp.replace(data_loader="torch", output_dir=small_config.output_dir + "_torch"))
    assert (device["data_loader"], torch_["data_loader"]) == ("device", "torch")
    for key in ("train_loss", "test_loss", "test_accuracy", "confusion_matrix"):
        assert device[key] == torch_[key], key


def test_stop_at_accuracy_ends_the_run_at_the_first_evaluation_that_reaches_it(config):
    results = train(config.replace(max_steps=None, epochs=1, eval_every=10, stop_at_accuracy=0.85))
    rows = read_metrics(config)
    assert results["test_accuracy"] >= 0.85 > max(r["test_accuracy"] for r in rows[:-1])
    assert results["steps"] == rows[-1]["step"] < 938


@pytest.mark.parametrize("plots", [True, False])
def test_plots_can_be_left_for_later(small_config, plots):
    from pathlib import Path

    from accel_mnist.report import wait_for_plots

    train(small_config.replace(plots=plots, max_steps=5, eval_every=0))  # drawn before train() returns
    drawn = {p.name for p in Path(small_config.output_dir).glob("*.png")}
    assert drawn == ({"training_curves.png", "confusion_matrix.png"} if plots else set())
    for png in Path(small_config.output_dir).glob("*.png"):
        png.unlink()
    train(small_config.replace(plots=plots, max_steps=5, eval_every=0, overwrite=True), plots_in_background=True)
    wait_for_plots(timeout=120)  # the CLI's way: drawn by a process of their own
    drawn = {p.name for p in Path(small_config.output_dir).glob("*.png")}
    assert drawn == ({"training_curves.png", "confusion_matrix.png"} if plots else set())
