"""`--dataset hf:NAME_OR_PATH` with all of MNIST: the published constants, and a run exactly like the
IDX files'."""

from __future__ import annotations

import time

import pytest
import torch

from accel_mnist import TrainConfig, train
from accel_mnist.data.catalog import load_split
from accel_mnist.data.tensor_dataset import pixel_mean_std
from tests.helpers import MNIST_DIR, real_mnist_present

datasets = pytest.importorskip("datasets")
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image  # noqa: E402

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_hf_data.py")

datasets.disable_progress_bars()
IMAGE_FEATURES = Features({"image": Image(), "label": ClassLabel(num_classes=10)})


def _need_mnist():
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")


def _mnist_dict(n_train=None, n_test=None) -> tuple[DatasetDict, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """MNIST from the IDX files as a DatasetDict of PNG-encoded images, and the source tensors."""
    _need_mnist()
    source = {
        "train": tuple(t[:n_train] for t in load_split("mnist", MNIST_DIR, train=True, download=False)),
        "test": tuple(t[:n_test] for t in load_split("mnist", MNIST_DIR, train=False, download=False)),
    }
    dd = DatasetDict({
        split: Dataset.from_dict({"image": list(x.numpy()), "label": y.numpy()}, features=IMAGE_FEATURES)
        for split, (x, y) in source.items()
    })  # fmt: skip
    return dd, source


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """datasets' cache in tmp: loading a parquet folder writes Arrow files there."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    return tmp_path / "hf_cache"


def test_mean_std_round_to_the_published_mnist_constants():
    _need_mnist()
    images, _ = load_split("mnist", MNIST_DIR, train=True, download=False)
    assert pixel_mean_std(images) == (0.1307, 0.3081)  # exact: 0.130660, 0.308108


@pytest.fixture(scope="session")
def full_mnist_saved(tmp_path_factory):
    """All of MNIST (60000 + 10000 PNG-encoded images) as a save_to_disk DatasetDict."""
    start = time.perf_counter()
    dd, _ = _mnist_dict()
    path = tmp_path_factory.mktemp("hf_full") / "mnist"
    dd.save_to_disk(str(path))
    seconds = time.perf_counter() - start
    assert seconds < 60, f"building the dataset took {seconds:.1f} s"  # about 6 s measured
    return path


def test_hf_mnist_trains_exactly_like_the_idx_files(full_mnist_saved, tmp_path):
    common = dict(model="linear", max_steps=100, quiet=True, data_dir=str(MNIST_DIR), download=False)
    hf = train(TrainConfig(dataset=f"hf:{full_mnist_saved}", output_dir=str(tmp_path / "hf"), **common))
    idx = train(TrainConfig(dataset="mnist", output_dir=str(tmp_path / "idx"), **common))
    # Same bytes, same order, same (rounded) mean/std: the same computation, bit for bit.
    assert hf["test_accuracy"] == idx["test_accuracy"] > 0.85
    assert hf["test_loss"] == idx["test_loss"] and hf["train_loss"] == idx["train_loss"]
    assert hf["confusion_matrix"] == idx["confusion_matrix"] and hf["dataset"] == f"hf:{full_mnist_saved}"
