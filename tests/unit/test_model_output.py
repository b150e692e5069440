"""What a model may return: a tensor, a ModelOutput, a mapping or object with `logits`, a tuple
or list whose first element is the logits; training, evaluation and predict read each alike,
and anything else stops with one line that says what came back."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from accel_mnist import TrainConfig, UsageError, train
from accel_mnist.model_output import logits_of
from class_images import PairDataset, splits


class Net(nn.Module):
    """A linear classifier whose forward wraps its logits as `wrap` says."""

    def __init__(self, wrap=lambda logits: logits):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)
        self.wrap = wrap

    def forward(self, x):
        return self.wrap(self.fc(x.flatten(1)))


class WithLogits:
    def __init__(self, logits):
        self.logits = logits


def _model_output(logits):
    from transformers.modeling_outputs import ImageClassifierOutput

    return ImageClassifierOutput(logits=logits)


WRAPS = {
    "tensor": lambda t: t,
    "model_output": _model_output,
    "dict": lambda t: {"logits": t, "features": t.detach()},
    "object": WithLogits,
    "tuple": lambda t: (t, None),
    "list": lambda t: [t],
}


@pytest.mark.parametrize("name", list(WRAPS))
def test_logits_of_each_kind(name):
    t = torch.randn(3, 10)
    assert logits_of(WRAPS[name](t)) is t


@pytest.mark.parametrize(
    "output, words",
    [
        (None, ["returned None"]),
        ("text", ["a str"]),
        ({"loss": torch.zeros(())}, ["a dict with keys (loss)"]),
        ((), ["an empty tuple"]),
        (("logits", 1), ["a tuple of 2 whose first element is a str"]),
        (WithLogits(None), ["a WithLogits whose logits is None"]),
        ({}, ["an empty dict"]),
    ],
)
def test_anything_else_is_one_line_naming_what_came_back(output, words):
    with pytest.raises(UsageError) as e:
        logits_of(output)
    message = str(e.value)
    assert "\n" not in message and "ModelOutput" in message
    for word in words:
        assert word in message, message


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
