"""Classes from the data: `hf:` datasets of 26 and 47 named classes train, evaluate and predict
end to end (built-in models sized to them, N x N confusion matrices, names in predict and the
export); a model of another width, or labels the training split does not have, stop in one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from torch import nn

from accel_mnist import DataError, TrainConfig, UsageError, train
from accel_mnist.cli import main
from tests.helpers import assert_one_line
from tests.your_model_data import BALANCED, LETTERS, save_hf, splits

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_classes_from_data.py")

pytest.importorskip("datasets")


@pytest.fixture(scope="module", params=[(26, LETTERS), (47, BALANCED)], ids=["letters-26", "balanced-47"])
def trained(request, tmp_path_factory):
    """A linear model trained on an hf: folder of N named classes, its run directory and the data."""
    num_classes, names = request.param
    root = tmp_path_factory.mktemp(f"classes{num_classes}")
    data = splits(num_classes, 2000, 470)
    spec = save_hf(root / "data", data, names)
    config = TrainConfig(model="linear", dataset=spec, max_steps=60, eval_every=30, batch_size=64, lr=3e-3,
                         quiet=True, output_dir=str(root / "run"))  # fmt: skip
    return train(config), root / "run", data, names, spec


def test_trains_end_to_end_with_the_datas_classes(trained):
    results, run, data, names, spec = trained
    n = len(names)
    assert (results["num_classes"], results["class_names"], results["dataset"]) == (n, names, spec)
    matrix = np.array(results["confusion_matrix"])
    assert matrix.shape == (n, n) and matrix.sum() == 470 == results["test_samples"]
    # rows are the true classes: their sums count the test labels
    assert matrix.sum(axis=1).tolist() == np.bincount(data["test"][1], minlength=n).tolist()
    assert results["test_accuracy"] == pytest.approx(np.trace(matrix) / 470)
    assert results["test_accuracy"] > 0.8  # chance is 1/n; measured 1.0 for both
    assert results["num_parameters"] == 28 * 28 * n + n  # the built-in model sized to the classes
    exported = json.loads((run / "model_config.json").read_text())
    assert (exported["num_classes"], exported["class_names"], exported["input_shape"]) == (n, names, [1, 28, 28])
    assert (run / "confusion_matrix.png").stat().st_size > 0  # drawn with n rows (report checks the shape)


def test_evaluate_and_predict_with_names(trained, tmp_path, capsys):
    from PIL import Image

    results, run, data, names, spec = trained
    assert main(["evaluate", "--model-path", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"test_accuracy {results['test_accuracy']:.4f}" in out and "samples 470" in out
    images, labels = data["test"]
    files = []
    for i in range(5):
        files.append(tmp_path / f"{i}.png")
        Image.fromarray(images[i]).save(files[-1])
    assert main(["predict", "--model-path", str(run), *map(str, files)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 5
    predicted = [line.split("\t")[1] for line in lines]
    assert all(p in names for p in predicted)
    # The pictures are bright on dark, as the training images, and the model is sure of them.
    assert sum(p == names[k] for p, k in zip(predicted, labels[:5], strict=True)) >= 4


def test_a_model_of_another_width_is_refused_before_any_output(tmp_path):
    spec = save_hf(tmp_path / "data", splits(26, 200, 50), LETTERS)
    model = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    with pytest.raises(UsageError) as e:
        train(TrainConfig(dataset=spec, max_steps=2, quiet=True, output_dir=str(tmp_path / "run")), model=model)
    assert_one_line(e, "10 logits per image", "26 classes", "give it 26 outputs")
    assert not (tmp_path / "run").exists()


def test_classes_without_names_are_the_largest_training_label_plus_one(tmp_path):
    data = splits(13, 300, 80)
    spec = save_hf(tmp_path / "plain", data)
    results = train(TrainConfig(model="linear", dataset=spec, max_steps=3, quiet=True, plots=False,
                                output_dir=str(tmp_path / "run")))  # fmt: skip
    assert results["num_classes"] == 13 and results["class_names"] is None
    assert len(results["confusion_matrix"]) == 13
    # A test label the training split does not have is refused, naming the split and the label.
    data["test"][1][0] = 13
    spec = save_hf(tmp_path / "beyond", data)
    with pytest.raises(DataError) as e:
        train(TrainConfig(model="linear", dataset=spec, max_steps=3, quiet=True, output_dir=str(tmp_path / "r2")))
    assert_one_line(e, "test", "label value 13 out of range 0..12")
    assert not (tmp_path / "r2").exists()


def test_evaluate_refuses_data_with_more_classes_than_the_model(trained, tmp_path, capsys):
    _, run, _, names, _ = trained
    data = splits(49, 100, 60)
    data["test"][1][0] = 48
    wider = save_hf(tmp_path / "wider", data, [str(i) for i in range(49)])
    assert main(["evaluate", "--model-path", str(run), "--dataset", wider]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and f"knows {len(names)} classes" in err
