"""The metrics row and results.json are built by named functions from the run's state."""

from __future__ import annotations

from types import SimpleNamespace

from accel_mnist.training.records import metrics_row, results_record


def _state(**kw):
    base = dict(step=30, samples=960, warmup_samples=32, train_seconds=2.0, warmup_seconds=0.5, skipped_steps=1)
    return SimpleNamespace(**{**base, **kw})


def test_metrics_row_rates_count_every_process_and_leave_out_the_warmup():
    evaluation = {"test_loss": 0.5, "test_accuracy": 0.9, "test_samples": 100}
    row = metrics_row(_state(), evaluation, train_loss=0.7, lr=0.01, steps_per_epoch=20, num_processes=2)
    assert row["epoch"] == 1.5 and row["step"] == 30
    assert row["samples_per_second"] == 960 * 2 / 2.0
    assert row["steady_samples_per_second"] == (960 - 32) * 2 / 1.5
    assert row["train_loss"] == 0.7 and row["lr"] == 0.01 and row["test_accuracy"] == 0.9


def test_results_take_the_last_row_without_epoch_and_step_plus_the_facts():
    row = {"epoch": 1.5, "step": 30, "test_accuracy": 0.9, "train_seconds": 1.0}
    facts = {"model": "cnn", "num_processes": 2}
    results = results_record(_state(), row, [[1]], steps_per_epoch=20, facts=facts, wall_seconds=5.0)
    assert "epoch" not in results and "step" not in results
    assert results["epochs"] == 1.5 and results["steps"] == 30
    assert results["train_seconds"] == 2.0  # the state's total, not the row's
    assert results["model"] == "cnn" and results["confusion_matrix"] == [[1]] and results["wall_seconds"] == 5.0
