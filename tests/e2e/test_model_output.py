"""Training, evaluation, export and predict read the logits of every kind of model output alike
(the kinds themselves: tests/unit/test_model_output.py)."""

from __future__ import annotations

import json

import pytest
import torch

from accel_mnist import TrainConfig, UsageError, train
from tests.your_model_data import WRAPS, Net, PairDataset, splits

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_model_output.py")


@pytest.fixture(scope="module")
def data():
    return {split: PairDataset(*arrays) for split, arrays in splits(10, 600, 200).items()}


def _train(tmp_path, data, model, name="run", **changes):
    config = TrainConfig(max_steps=12, eval_every=6, batch_size=32, eval_batch_size=64, quiet=True, plots=False,
                         output_dir=str(tmp_path / name), **changes)  # fmt: skip
    return train(config, model=model, train_data=data["train"], test_data=data["test"])


def test_every_kind_trains_evaluates_and_exports_like_a_tensor(tmp_path, data):
    from accel_mnist.export.model_dir import load_model
    from accel_mnist.export.predict import predict_files

    results = {}
    for name, wrap in WRAPS.items():
        torch.manual_seed(0)
        results[name] = _train(tmp_path, data, Net(wrap), name)
    reference = results["tensor"]
    for name, got in results.items():
        for key in ("train_loss", "test_loss", "test_accuracy", "confusion_matrix"):
            assert got[key] == reference[key], (name, key)
    # predict reads the exported model's logits whatever the model returns
    from PIL import Image

    png = tmp_path / "one.png"
    Image.fromarray(data["test"].images[0].numpy()).save(png)
    exported = json.loads((tmp_path / "tensor" / "model_config.json").read_text())
    picks = {
        name: predict_files(load_model(tmp_path / name, model=Net(wrap)), [png], exported["mean"], exported["std"])
        for name, wrap in WRAPS.items()
    }
    assert all(p == picks["tensor"] for p in picks.values())


def test_a_model_returning_something_else_stops_before_anything_is_written(tmp_path, data):
    with pytest.raises(UsageError) as e:
        _train(tmp_path, data, Net(lambda t: {"scores": t}))
    assert "\n" not in str(e.value) and "a dict with keys (scores)" in str(e.value)
    assert not (tmp_path / "run").exists()
