"""Hugging Face `datasets` as a data source: `--dataset hf:NAME_OR_PATH`.

NAME_OR_PATH is one of
  * a folder written by `Dataset(Dict).save_to_disk` (read with `datasets.load_from_disk`),
  * any other local folder `datasets.load_dataset` understands: parquet files (the split comes
    from the file names, e.g. train-00000-of-00001.parquet / test.parquet or train/ and test/
    folders), csv/json, or an image folder,
  * a Hub dataset name such as `ylecun/mnist` (needs the network the first time; datasets keeps
    it in its cache, ~/.cache/huggingface/datasets or $HF_DATASETS_CACHE, and with
    HF_HUB_OFFLINE=1 reads it from there without the network).

The image column (a `datasets.Image`, an `Array2D` or a 2-D list of ints) and the integer label
column (a `ClassLabel` or an int `Value`) are found by their types; `train` and `test` splits
are required. Images are decoded to grayscale ("L") by datasets itself, or kept in colour where
the column says so (`datasets.Image(mode="RGB")`, e.g. after `cast_column`); every image of both
splits has the size of the first, with pixel values 0..255. The classes are the `ClassLabel`'s
names, else 0..(the largest training label); the test labels must lie among them. Everything is
converted once into uint8 (N, H, W) (or (N, 3, H, W)) / int64 tensors, as the IDX path gives
them, so the rest of the program cannot tell.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import DataError, one_line
from .tensor_dataset import Split, Splits

__all__ = [
    "read_hf_dataset",
    "read_hf_splits",
    "find_columns",
    "split_to_tensors",
]

SPLITS = ("train", "test")
# Rows decoded per batch: bounds the temporary int64 copies the numpy formatter makes of array
# columns (10000 x 784 x 8 bytes = 63 MB) while keeping per-batch overhead negligible.
BATCH = 10000
_IMAGE_NAMES = ("image", "img", "pixels", "pixel_values")
_LABEL_NAMES = ("label", "labels", "target", "targets", "y")


def read_hf_dataset(spec: str, data_dir: str | os.PathLike | None = None, download: bool = True) -> Splits:
    """Both splits of `hf:NAME_OR_PATH` as read, for build_datasets (see read_hf_splits).

    `data_dir` is not used (datasets has its own cache). `download=False` loads a Hub name only
    from datasets' cache, which needs HF_HUB_OFFLINE=1 (datasets reads it at import time).
    """
    name = spec[3:] if spec.startswith("hf:") else spec
    dsdict = _load(spec, name, download)
    missing = [s for s in SPLITS if s not in dsdict]
    if missing:
        raise DataError(
            f"{spec}: no {' or '.join(repr(s) for s in missing)} split "
            f"(found: {', '.join(dsdict) or 'none'}); train and test splits are needed"
        )
    return read_hf_splits(dsdict["train"], dsdict["test"], spec)


def read_hf_splits(train: Any, test: Any, where: str) -> Splits:
    """Two `datasets.Dataset`s as read, for build_datasets: both splits decoded and checked for
    size and pixels, with the training split's ClassLabel names (see the module doc)."""
    image_col, label_col = find_columns(train, where)
    train_x, train_y = split_to_tensors(train, image_col, label_col, f"{where} train")
    if len(train_x) == 0:
        raise DataError(f"{where}: the train split is empty")
    shape = _decoded_shape(train_x)
    test_x, test_y = split_to_tensors(test, image_col, label_col, f"{where} test", shape=shape)
    if len(test_x) == 0:
        raise DataError(f"{where}: the test split is empty")
    names = _class_names(train, test, label_col, where)
    train_split, test_split = Split(train_x, train_y, f"{where} train"), Split(test_x, test_y, f"{where} test")
    return Splits(train_split, test_split, class_names=names, note=lambda count: f" (column {label_col!r})")


def _class_names(train: Any, test: Any, label_col: str, where: str) -> tuple[str, ...] | None:
    """The ClassLabel names of the training split; the test split may not name others."""
    from datasets import ClassLabel

    feature, other = train.features[label_col], test.features.get(label_col)
    if not isinstance(feature, ClassLabel):
        return None
    if isinstance(other, ClassLabel) and list(other.names) != list(feature.names):
        raise DataError(f"{where}: the train and test splits name different classes (column {label_col!r})")
    return tuple(str(n) for n in feature.names)


def _decoded_shape(images: torch.Tensor) -> tuple[int, ...]:
    """One image's shape as datasets decodes it: (H, W), or (H, W, 3) in colour."""
    return tuple(images.shape[1:]) if images.ndim == 3 else (*images.shape[2:], images.shape[1])


def _load(spec: str, name: str, download: bool) -> Any:
    """The DatasetDict behind `name`: a local folder, else a Hub dataset."""
    import datasets

    path = Path(name).expanduser()
    try:
        if path.is_dir():
            if (path / "dataset_dict.json").is_file():
                return datasets.load_from_disk(str(path))
            if (path / "state.json").is_file():
                # save_to_disk of a single Dataset: there are no splits to take.
                raise DataError(f"{spec}: {path} holds a single saved Dataset; save a DatasetDict "
                                "with 'train' and 'test' splits")  # fmt: skip
            return datasets.load_dataset(str(path))
        if path.exists():
            raise DataError(f"{spec}: {path} is a file; give the folder that holds the dataset")
        if name.startswith(("/", ".", "~")) or name.count("/") > 1:
            raise DataError(f"{spec}: no such folder {path}")
        if not download and not datasets.config.HF_HUB_OFFLINE:
            raise DataError(
                f"{spec}: not a local folder, and downloading is off; to use datasets' cache "
                "without the network, export HF_HUB_OFFLINE=1"
            )
        return datasets.load_dataset(name)
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 - datasets raises many kinds; all mean "no data"
        reason = one_line(exc)
        raise DataError(f"{spec}: could not load: {type(exc).__name__}: {reason}") from None


def _is_2d_array(feature: Any) -> bool:
    from datasets import Array2D, LargeList, Value

    try:
        from datasets import List
    except ImportError:  # datasets < 4 calls the list feature Sequence
        from datasets import Sequence as List  # type: ignore[assignment,no-redef]

    if isinstance(feature, Array2D):
        return True
    inner = getattr(feature, "feature", None)
    return (
        isinstance(feature, (List, LargeList))
        and isinstance(inner, (List, LargeList))
        and isinstance(inner.feature, Value)
    )


def _is_int_label(feature: Any) -> bool:
    from datasets import ClassLabel, Value

    return isinstance(feature, ClassLabel) or (isinstance(feature, Value) and feature.dtype.startswith(("int", "uint")))


def _pick(candidates: list[str], preferred: tuple[str, ...]) -> str | None:
    for name in preferred:
        if name in candidates:
            return name
    return candidates[0] if candidates else None


def find_columns(ds: Any, where: str) -> tuple[str, str]:
    """(image column, label column) of `ds`, chosen by feature type; DataError if either is absent."""
    from datasets import Image

    features = ds.features
    images = [c for c, f in features.items() if isinstance(f, Image) or _is_2d_array(f)]
    labels = [c for c, f in features.items() if _is_int_label(f)]
    image_col = _pick(images, _IMAGE_NAMES)
    label_col = _pick(labels, _LABEL_NAMES)
    if image_col is None or label_col is None:
        found = ", ".join(f"{c}: {_feature_name(f)}" for c, f in features.items())
        wanted = "image column (datasets.Image or a 2-D array)" if image_col is None else (
            "integer label column (ClassLabel or int)")  # fmt: skip
        raise DataError(f"{where}: found no {wanted} among the columns ({found})")
    return image_col, label_col


def _feature_name(feature: Any) -> str:
    return f"Value({feature.dtype})" if type(feature).__name__ == "Value" else type(feature).__name__


def split_to_tensors(
    ds: Any, image_col: str, label_col: str, where: str, shape: tuple[int, ...] | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One split as uint8 (N, H, W) images ((N, 3, H, W) for a column decoded in "RGB") and
    int64 (N,) labels, validated; every image must have `shape` (default: the first image's).

    Decoding is datasets' own numpy formatter, batch by batch (for PNG-encoded images that is
    one PIL decode per image, as a hand-written PIL loop would do, and it also covers Array2D /
    nested-list columns).
    """
    from datasets import Image

    for col in (image_col, label_col):
        if col not in ds.features:
            raise DataError(f"{where}: no column {col!r} (columns: {', '.join(ds.features)})")
    feature = ds.features[image_col]
    if isinstance(feature, Image):
        # datasets converts each decoded PIL image to the mode itself; a cast of the feature only,
        # the stored bytes are not rewritten. Grayscale unless the column asks for colour.
        ds = ds.cast_column(image_col, Image(mode="RGB" if feature.mode == "RGB" else "L"))
    n = len(ds)
    view = ds.with_format("numpy", columns=[image_col, label_col])
    if n == 0:
        return torch.empty((0, *(shape or (0, 0))), dtype=torch.uint8), torch.empty(0, dtype=torch.int64)
    first = view[:1][image_col]
    expected = tuple(shape or np.shape(first[0]))
    suffix = "" if shape is None else " as in the train split"
    _check_images(first, where, 0, expected, suffix)  # a wrong size fails before decoding all
    colour = len(expected) == 3
    images = np.empty((n, 3, *expected[:2]) if colour else (n, *expected), dtype=np.uint8)
    labels = np.empty(n, dtype=np.int64)
    pos = 0
    for batch in view.iter(batch_size=BATCH):
        x, y = batch[image_col], batch[label_col]
        _check_images(x, where, pos, expected, suffix)
        images[pos : pos + len(x)] = x.transpose(0, 3, 1, 2) if colour else x
        labels[pos : pos + len(y)] = y
        pos += len(x)
    return torch.from_numpy(images), torch.from_numpy(labels)


def _check_images(x: np.ndarray, where: str, offset: int, expected: tuple[int, ...], suffix: str = "") -> None:
    if x.dtype == object or x.shape[1:] != expected:
        # Ragged sizes come back as an object array of per-image arrays.
        shapes = [np.shape(item) for item in x] if x.dtype == object else [x.shape[1:]] * len(x)
        index, shape = next((i, s) for i, s in enumerate(shapes) if tuple(s) != expected)
        kind = "colour" if len(expected) == 3 else "grayscale"
        raise DataError(f"{where}: image {offset + index} has shape {tuple(shape)}; expected {expected} {kind}{suffix}")
    if x.dtype == np.uint8 or len(x) == 0:
        return
    if x.dtype.kind not in "iuf" or (x.dtype.kind == "f" and not np.array_equal(x, np.round(x))):
        raise DataError(f"{where}: expected 8-bit pixel values 0..255, found {x.dtype} values")
    if x.min() < 0 or x.max() > 255:
        raise DataError(f"{where}: pixel values must be 0..255, found {x.min()}..{x.max()}")
