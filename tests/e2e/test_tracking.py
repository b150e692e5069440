"""Experiment tracking through Accelerate's trackers, read back from TensorBoard's event files."""

from __future__ import annotations

import json

import pytest

from accel_mnist import TrainConfig, train

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_tensorboard_gets_every_metric_and_the_config(synthetic_mnist, tmp_path):
    out = tmp_path / "run"
    config = TrainConfig(model="linear", data_dir=str(synthetic_mnist), download=False, quiet=True, export=False,
                         output_dir=str(out), max_steps=40, eval_every=20, report_to="tensorboard")  # fmt: skip
    train(config)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    event_dirs = {p.parent for p in out.glob("**/events.out.tfevents.*")}
    scalars = {}
    for d in event_dirs:
        acc = event_accumulator.EventAccumulator(str(d))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            scalars[tag] = [(e.step, e.value) for e in acc.Scalars(tag)]
    for key in ("train_loss", "test_loss", "test_accuracy", "lr", "samples_per_second"):
        assert [s for s, _ in scalars[key]] == [r["step"] for r in rows]
        assert [v for _, v in scalars[key]] == pytest.approx([r[key] for r in rows], rel=1e-6)
    # The run's config is logged as hyperparameters (TensorBoard keeps them in a plugin tag).
    hparams_files = list(out.glob("**/events.out.tfevents.*"))
    assert any(b"batch_size" in f.read_bytes() for f in hparams_files)
