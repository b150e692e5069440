"""`--dataset hf:NAME_OR_PATH`: Hugging Face datasets from save_to_disk folders, parquet and the Hub."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accel_mnist import DataError
from accel_mnist.data.catalog import load_datasets, load_split
from accel_mnist.data.tensor_dataset import pixel_mean_std
from tests.helpers import synthetic_counts

datasets = pytest.importorskip("datasets")
from datasets import Array2D, ClassLabel, Dataset, DatasetDict, Features, Image, Value  # noqa: E402

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("unit/test_hf_data.py")

datasets.disable_progress_bars()
IMAGE_FEATURES = Features({"image": Image(), "label": ClassLabel(num_classes=10)})


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """datasets' cache in tmp: loading a parquet folder writes Arrow files there."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    return tmp_path / "hf_cache"


@pytest.fixture(scope="module")
def small(tmp_path_factory, synthetic_mnist_files):
    """512 train / 128 test images of the synthetic MNIST files, as PNGs in a DatasetDict saved with
    save_to_disk and as parquet files; and the source tensors."""
    with synthetic_counts():
        source = {
            "train": tuple(t[:512] for t in load_split("mnist", synthetic_mnist_files, train=True, download=False)),
            "test": load_split("mnist", synthetic_mnist_files, train=False, download=False),
        }
    dd = DatasetDict({
        split: Dataset.from_dict({"image": list(x.numpy()), "label": y.numpy()}, features=IMAGE_FEATURES)
        for split, (x, y) in source.items()
    })  # fmt: skip
    root = tmp_path_factory.mktemp("hf_small")
    dd.save_to_disk(str(root / "saved"))
    for split, ds in dd.items():
        ds.to_parquet(str(root / "parquet" / f"{split}-00000-of-00001.parquet"))
    return root, source


def _assert_same(loaded, source):
    for ds, split in zip(loaded, ("train", "test"), strict=True):
        x, y = source[split]
        assert ds.images.dtype == torch.uint8 and ds.images.shape == x.shape
        assert ds.labels.dtype == torch.int64
        assert torch.equal(ds.images, x) and torch.equal(ds.labels, y)


@pytest.mark.parametrize("layout", ["saved", "parquet"])
def test_loads_save_to_disk_and_parquet_folders(small, layout, datasets_cache):
    root, source = small
    train_set, test_set = load_datasets(f"hf:{root / layout}", data_dir=None)
    _assert_same((train_set, test_set), source)
    # parquet goes through datasets' builder and its (here temporary) cache; save_to_disk is read in place.
    assert datasets_cache.exists() == (layout == "parquet")
    mean, std = pixel_mean_std(source["train"][0])
    assert (train_set.mean, train_set.std) == (test_set.mean, test_set.std) == (mean, std)
    image, label = train_set[0]
    assert image.shape == (1, 28, 28) and image.dtype == torch.float32 and int(label) == int(source["train"][1][0])


def test_array_columns_are_found_by_type(tmp_path):
    # 2-D int lists (what from_dict makes of arrays) and an Array2D, next to a text column, with
    # labels an int Value instead of a ClassLabel; names that are not "image"/"label".
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, size=(12, 28, 28), dtype=np.uint8)
    labels = np.arange(12) % 10
    for name, features in [
        ("lists", None),
        ("array2d", Features({"note": Value("string"), "pixels": Array2D((28, 28), "uint8"), "y": Value("int32")})),
    ]:
        data = {"note": ["x"] * 12, "pixels": list(pixels), "y": labels}
        ds = Dataset.from_dict(data, features=features)
        DatasetDict(train=ds, test=ds.select(range(4))).save_to_disk(str(tmp_path / name))
        train_set, test_set = load_datasets(f"hf:{tmp_path / name}", None)
        assert torch.equal(train_set.images, torch.from_numpy(pixels)), name
        assert train_set.labels.tolist() == labels.tolist() and len(test_set) == 4


def test_colour_images_are_converted_to_grayscale(tmp_path):
    import PIL.Image

    rng = np.random.default_rng(1)
    rgb = [PIL.Image.fromarray(rng.integers(0, 256, size=(28, 28, 3), dtype=np.uint8)) for _ in range(3)]
    ds = Dataset.from_dict({"image": rgb, "label": [1, 2, 3]}, features=IMAGE_FEATURES)
    DatasetDict(train=ds, test=ds).save_to_disk(str(tmp_path / "rgb"))
    train_set, _ = load_datasets(f"hf:{tmp_path / 'rgb'}", None)
    # The stored PNGs are RGB; PIL's own "L" conversion is the reference.
    expected = np.stack([np.asarray(PIL.Image.open(p).convert("L")) for p in _png_paths(ds)])
    assert torch.equal(train_set.images, torch.from_numpy(expected))


def _png_paths(ds):
    import io

    return [io.BytesIO(item["bytes"]) for item in ds.cast_column("image", Image(decode=False))["image"]]


def _save(tmp_path, name, train, test=None, features=IMAGE_FEATURES):
    splits = {"train": Dataset.from_dict(train, features=features)}
    if test is not None:
        splits["test"] = Dataset.from_dict(test, features=features)
    DatasetDict(splits).save_to_disk(str(tmp_path / name))
    return f"hf:{tmp_path / name}"


def _error(spec, **kwargs) -> str:
    with pytest.raises(DataError) as info:
        load_datasets(spec, None, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_wrong_image_size_is_rejected(tmp_path):
    ok = [np.zeros((28, 28), np.uint8)] * 2
    spec = _save(tmp_path, "big", {"image": [np.zeros((32, 32), np.uint8)] * 2, "label": [0, 1]},
                 {"image": ok, "label": [0, 1]})  # fmt: skip
    message = _error(spec)
    assert spec in message and "(32, 32)" in message and "image 0" in message
    # One odd image among good ones: named by its index.
    spec = _save(tmp_path, "ragged", {"image": ok + [np.zeros((28, 27), np.uint8)], "label": [0, 1, 2]},
                 {"image": ok, "label": [0, 1]})  # fmt: skip
    assert "image 2 has shape (28, 27)" in _error(spec)


def test_labels_out_of_range_are_rejected(tmp_path):
    features = Features({"image": Image(), "label": Value("int64")})
    ok = {"image": [np.zeros((28, 28), np.uint8)] * 2, "label": [0, 9]}
    spec = _save(tmp_path, "labels", ok, {**ok, "label": [3, 10]}, features=features)
    message = _error(spec)
    assert "test" in message and "label value 10 out of range 0..9" in message


def test_missing_split_and_missing_columns(tmp_path):
    ok = {"image": [np.zeros((28, 28), np.uint8)] * 2, "label": [0, 1]}
    assert "no 'test' split (found: train)" in _error(_save(tmp_path, "no_test", ok))
    ds = Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]})
    DatasetDict(train=ds, test=ds).save_to_disk(str(tmp_path / "text"))
    message = _error(f"hf:{tmp_path / 'text'}")
    assert "found no image column" in message and "(text: Value(string), label: Value(int64))" in message
    Dataset.from_dict(ok, features=IMAGE_FEATURES).save_to_disk(str(tmp_path / "single"))
    assert "single saved Dataset" in _error(f"hf:{tmp_path / 'single'}")
    pixels = np.full((1, 28, 28), 0.5, dtype=np.float32)
    ds = Dataset.from_dict({"image": list(pixels), "label": [1]})
    DatasetDict(train=ds, test=ds).save_to_disk(str(tmp_path / "float"))
    assert "expected 8-bit pixel values 0..255" in _error(f"hf:{tmp_path / 'float'}")


def test_missing_folder_and_hub_names(tmp_path, monkeypatch, small):
    assert "no such folder" in _error(f"hf:{tmp_path / 'nowhere'}")
    # A Hub name without the network and with downloading off fails at once, not after retries.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    assert "downloading is off" in _error("hf:someone/mnist", download=False)
    # With downloading on, a Hub name goes to datasets.load_dataset as it is.
    root, source = small
    calls = []

    def fake_load_dataset(name, *args, **kwargs):
        calls.append(name)
        return datasets.load_from_disk(str(root / "saved"))

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    _assert_same(load_datasets("hf:someone/mnist", None), source)
    assert calls == ["someone/mnist"]

    def unreachable(name, *args, **kwargs):
        raise ConnectionError(f"Couldn't reach '{name}' on the Hub\n(LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    message = _error("hf:someone/mnist")
    assert message.startswith("hf:someone/mnist: could not load: ConnectionError: Couldn't reach")
