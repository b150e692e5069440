"""MNIST-family datasets: where their files are, download, validation and torch Datasets."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..caller import setting
from ..errors import DataError, one_line
from .idx import read_idx
from .tensor_dataset import ImageTensorDataset, Split, Splits, build_datasets, check_label_range

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "ImageTensorDataset",
    "download",
    "find_split_files",
    "load_datasets",
    "load_split",
    "read_dataset",
    "read_idx",
    "resolve_data_dir",
]


@dataclass(frozen=True)
class DatasetSpec:
    """Static facts about one dataset: names, normalisation constants, classes, sizes."""

    name: str
    torchvision_name: str
    mean: float
    std: float
    classes: tuple[str, ...]
    train_records: int = 60000
    test_records: int = 10000


DATASETS: dict[str, DatasetSpec] = {
    "mnist": DatasetSpec("mnist", "MNIST", 0.1307, 0.3081, tuple(str(d) for d in range(10))),
    "fashion_mnist": DatasetSpec(
        "fashion_mnist",
        "FashionMNIST",
        0.2860,
        0.3530,
        ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"),
    ),
    "kmnist": DatasetSpec(
        "kmnist",
        "KMNIST",
        0.1918,
        0.3483,
        ("o", "ki", "su", "tsu", "na", "ha", "ma", "ya", "re", "wo"),
    ),
}

SPLIT_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def _spec(name: str) -> DatasetSpec:
    try:
        return DATASETS[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; choose one of: {', '.join(DATASETS)}") from None


def resolve_data_dir(data_dir: str | os.PathLike | None) -> Path:
    """Return `data_dir` if given, else $ACCEL_MNIST_DATA_DIR if set and non-empty, else ./data."""
    if data_dir is not None:
        return Path(data_dir)
    return Path(os.environ.get("ACCEL_MNIST_DATA_DIR") or "data")


def _locate(spec: DatasetSpec, root: Path) -> dict[str, Path | None]:
    found: dict[str, Path | None] = {}
    for key, base in SPLIT_FILES.items():
        candidates = []
        for folder in (root, root / spec.torchvision_name / "raw"):
            candidates += [folder / base, folder / f"{base}.gz"]
        found[key] = next((p for p in candidates if p.is_file()), None)
    return found


def find_split_files(name: str, data_dir: str | os.PathLike | None) -> dict[str, Path] | None:
    """Locate the four IDX files of `name` (flat or torchvision layout, raw or .gz); None if any is missing."""
    found = _locate(_spec(name), resolve_data_dir(data_dir))
    if any(p is None for p in found.values()):
        return None
    return found  # type: ignore[return-value]


def download(name: str, data_dir: str | os.PathLike | None) -> None:
    """Download both splits of `name` into `data_dir/<torchvision_name>/raw/` with torchvision."""
    spec = _spec(name)
    root = resolve_data_dir(data_dir)
    try:
        # Imported here: torchvision takes seconds to import and the normal path never needs it.
        from torchvision import datasets as tv_datasets

        cls = getattr(tv_datasets, spec.torchvision_name)
        for train in (True, False):
            cls(root=str(root), train=train, download=True)
    except Exception as exc:  # noqa: BLE001 - any failure here means "no data", reported as such
        reason = one_line(exc)
        raise DataError(
            f"could not download {name} into {root}: {reason}; "
            f"put the four IDX files there (see README) or pass {setting('data_dir')}"
        ) from None


def _fetch(name: str, root: Path) -> None:
    # load_split's `download` parameter shadows the function; resolve the module global at call
    # time so tests (and callers) can monkeypatch accel_mnist.data.download.
    download(name, root)


def _read_split(name: str, spec: DatasetSpec, root: Path, train: bool, download: bool) -> Split:
    """One split's IDX files under `root` (fetched first where missing and `download`), checked
    for shape, type and record count; the labels are not yet checked against the classes."""
    split = "train" if train else "test"
    keys = (f"{split}_images", f"{split}_labels")
    found = _locate(spec, root)
    if download and any(found[k] is None for k in keys):
        _fetch(name, root)
        found = _locate(spec, root)
    missing = [SPLIT_FILES[k] for k in keys if found[k] is None]
    if missing:
        raise DataError(
            f"{name} {split} data not found in {root}: missing {', '.join(missing)} "
            f"(looked for <file>[.gz] there and in {spec.torchvision_name}/raw/)"
            + ("" if download else "; downloading is off")
        )
    img_path, lbl_path = found[keys[0]], found[keys[1]]
    assert img_path is not None and lbl_path is not None  # nothing is missing (checked above)
    images, labels = read_idx(img_path), read_idx(lbl_path)

    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(f"{img_path}: expected images of shape (N, 28, 28), found {images.shape}")
    if images.dtype != np.uint8:
        raise DataError(f"{img_path}: expected uint8 pixels, found {images.dtype}")
    if labels.ndim != 1:
        raise DataError(f"{lbl_path}: expected labels of shape (N,), found {labels.shape}")
    if labels.dtype.kind not in "iu":
        raise DataError(f"{lbl_path}: expected integer labels, found {labels.dtype}")
    if len(images) != len(labels):
        raise DataError(f"{img_path} has {len(images)} images but {lbl_path} has {len(labels)} labels")
    expected = spec.train_records if train else spec.test_records
    if len(images) != expected:
        raise DataError(f"{img_path}: expected {expected} records, found {len(images)} ({name} {split} split)")
    return Split(torch.from_numpy(images), torch.from_numpy(labels.astype(np.int64)), str(lbl_path))


def load_split(
    name: str, data_dir: str | os.PathLike | None, train: bool, download: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one split: uint8 images (N, 28, 28) and int64 labels (N,), validated."""
    spec = _spec(name)
    split = _read_split(name, spec, resolve_data_dir(data_dir), train, download)
    # On its own, a split is checked here; both splits of a dataset are checked by build_datasets.
    check_label_range(split.labels.numpy(), len(spec.classes), split.where)
    assert split.images is not None  # read from files
    return split.images, split.labels


def read_dataset(name: str, data_dir: str | os.PathLike | None, download: bool = True) -> Splits:
    """Both splits of `name` as read, for build_datasets: the catalog's IDX files with the spec's
    classes and mean/std, or, for `hf:NAME_OR_PATH`, a Hugging Face dataset (see hf.py)."""
    if not name.startswith("hf:"):
        spec = _spec(name)
        root = resolve_data_dir(data_dir)
        # The training split first: a download it needs fetches the test split as well.
        train, test = (_read_split(name, spec, root, is_train, download) for is_train in (True, False))
        return Splits(train, test, class_names=spec.classes, mean=spec.mean, std=spec.std)
    from .hf import read_hf_dataset  # imported only when asked for: datasets is slow to import

    return read_hf_dataset(name, data_dir, download)


def load_datasets(
    name: str, data_dir: str | os.PathLike | None, download: bool = True
) -> tuple[ImageTensorDataset, ImageTensorDataset]:
    """Load (train, test) ImageTensorDatasets for `name`, normalised with the spec's mean/std."""
    return build_datasets(read_dataset(name, data_dir, download))
