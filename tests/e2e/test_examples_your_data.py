"""The "your model, your data" examples run as a user would run them, on CPU, with quick settings."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_example


def test_transformers_model(tmp_path, mnist_dir):
    out = run_example("transformers_model.py", "--max-steps", "40", "--output-dir", str(tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["model"] == "ViTForImageClassification" and results["steps"] == 40
    assert results["test_accuracy"] > 0.2  # 0.43 after 100 steps; chance is 0.1
    assert "ViTForImageClassification, same logits: True" in out


@pytest.mark.parametrize("classes, count", [("letters", 26), ("balanced", 47)])
def test_many_classes(tmp_path, classes, count):
    args = ["--classes", classes, "--out", str(tmp_path / "data"), "--train-size", "2000", "--test-size", "300",
            "--max-steps", "100", "--output-dir", str(tmp_path / "run")]  # fmt: skip
    out = run_example("many_classes.py", *args)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["num_classes"] == count and len(results["confusion_matrix"]) == count
    assert results["test_accuracy"] > 0.5  # chance is 1/26 or 1/47
    predictions = [line.split("\t") for line in out.splitlines() if line.count("\t") == 2]
    assert len(predictions) == 3
    # predict prints each picture's class by name (the file name ends with the true one).
    assert all(label in results["class_names"] for _, label, _ in predictions)


@pytest.mark.parametrize("augment", [False, True])
def test_torch_dataset(tmp_path, augment):
    args = ["--data", str(tmp_path / "bars"), "--train-size", "1500", "--test-size", "300", "--max-steps", "40",
            "--output-dir", str(tmp_path / "run")] + (["--augment"] if augment else [])  # fmt: skip
    out = run_example("torch_dataset.py", *args)
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["dataset"] == "own:PNGFolder" and results["class_names"][:2] == ["bar 0", "bar 1"]
    assert results["data_loader"] == ("torch" if augment else "device")
    assert results["test_accuracy"] > 0.8 and "test accuracy" in out


def test_colour_images(tmp_path):
    out = run_example("colour_images.py", "--max-steps", "60", "--output-dir", str(tmp_path / "run"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["input_shape"] == [3, 32, 32] and results["model"] == "SmallCNN"
    assert results["test_accuracy"] > 0.8
    assert "built-in cnn: model 'cnn' takes 1x28x28 images but own:TensorDataset has 3x32x32" in out
