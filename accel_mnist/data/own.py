"""Your own data in the loop: `train(config, train_data=..., test_data=...)`.

Each split is a map-style torch `Dataset` of (image, label) pairs, or a `datasets.Dataset`
(read as `hf:` folders are, see hf.py). An image is a tensor (or numpy array) of shape (H, W) or
(C, H, W), the same for every item: uint8 pixels 0..255 (or other integers in that range), or
floats, taken as they are (0..1, as torchvision's ToTensor gives them); a label is an int or a
one-element integer tensor.

A torch Dataset is read once at the start, item by item: its labels give the classes (its
`classes` attribute, as torchvision datasets have, names them; else 0..the largest training
label), its training pixels the mean and std unless they are given. Where both splits fit in a
quarter of the host's available memory they are kept, as tensors, and train like the built-in
sets (the device path where the device holds them); otherwise, and always with
`data_loader="torch"`, every item is read again each time it is needed, through a torch
DataLoader: the choice for a Dataset that draws random augmentations in `__getitem__`.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from ..errors import DataError, UsageError
from .placement import copy_fits
from .tensor_dataset import ImageTensorDataset, Normaliser, PixelStats, Split, Splits, check_normalisation
from .worker_threads import WorkerThreads

__all__ = ["ItemDataset", "ItemSplit", "own_splits"]


def own_splits(
    train_data: Any,
    test_data: Any,
    *,
    data_loader: str = "auto",
    local_processes: int = 1,
    num_workers: int = 0,
    mean: float | None = None,
    std: float | None = None,
) -> Splits:
    """The caller's own splits as read (see the module doc), for build_datasets, which applies the
    caller's `mean`/`std`: given, they only spare counting the pixels here.

    `local_processes`: the training processes on this host, each of which holds its own copy.
    """
    if train_data is None or test_data is None:
        raise UsageError("train_data and test_data go together: pass both splits")
    check_normalisation(mean, std)  # before a read that may take long
    hf = sys.modules.get("datasets")  # a datasets.Dataset means datasets is imported already
    if hf is not None and isinstance(train_data, hf.DatasetDict):
        raise UsageError("train_data is a DatasetDict: pass its splits, train_data=dd['train'], test_data=dd['test']")
    if isinstance(train_data, ImageTensorDataset) and isinstance(test_data, ImageTensorDataset):
        return _held(train_data, test_data)
    if hf is None or not (isinstance(train_data, hf.Dataset) and isinstance(test_data, hf.Dataset)):
        return _from_torch_datasets(train_data, test_data, data_loader, local_processes, num_workers, mean)
    from .hf import read_hf_splits

    return read_hf_splits(train_data, test_data, "train_data/test_data")


def _held(train: ImageTensorDataset, test: ImageTensorDataset) -> Splits:
    """Two ImageTensorDatasets as they are, with their classes and normalisation."""
    for where, split in (("train_data", train), ("test_data", test)):
        if len(split) == 0:
            raise DataError(f"{where} is empty")
    names = train.class_names
    held = Split(train.images, train.labels, "train_data"), Split(test.images, test.labels, "test_data")
    return Splits(*held, class_names=names, mean=train.mean, std=train.std, note=_classes_note(names))


def _classes_note(names: Sequence[str] | None) -> Callable[[int], str]:
    """What a label error adds: where the classes of the caller's splits come from."""
    source = "its classes attribute" if names else "the training labels"
    return lambda count: f" (the {count} classes of {source})"


def _from_torch_datasets(
    train_data: Any, test_data: Any, data_loader: str, local_processes: int, num_workers: int, mean: float | None
) -> Splits:
    """Two torch Datasets read once: kept as tensors where both fit in memory (and `data_loader`
    allows), else ItemSplits, read again item by item through a DataLoader."""
    for where, split in (("train_data", train_data), ("test_data", test_data)):
        _check_map_style(split, where)
    shape, kind = _layout(train_data, "train_data")
    if _layout(test_data, "test_data") != (shape, kind):
        test_shape, test_kind = _layout(test_data, "test_data")
        raise DataError(f"test_data holds {test_kind} images of shape {test_shape}, train_data {kind} of {shape}")
    itemsize = 1 if kind == "uint8" else 4
    nbytes = (len(train_data) + len(test_data)) * int(np.prod(shape)) * itemsize * max(local_processes, 1)
    keep = data_loader != "torch" and copy_fits("cpu", nbytes)
    # Not kept, the pixels are counted as they pass (kept, from the tensor: in bigger batches).
    stats = PixelStats() if mean is None and not keep else None
    train_x, train_y = _read(train_data, "train_data", shape, kind, keep, num_workers, stats)
    test_x, test_y = _read(test_data, "test_data", shape, kind, keep, num_workers)
    names = _names(train_data)
    note = _classes_note(names)
    if keep:
        held = Split(train_x, train_y, "train_data"), Split(test_x, test_y, "test_data")
        return Splits(*held, class_names=names, note=note)
    read_again = (ItemSplit(None, train_y, "train_data", train_data, shape, kind),
                  ItemSplit(None, test_y, "test_data", test_data, shape, kind))  # fmt: skip
    mean, std = stats.mean_std() if stats is not None else (None, None)
    return Splits(*read_again, class_names=names, mean=mean, std=std, note=note)


def _check_map_style(split: Any, where: str) -> None:
    if isinstance(split, IterableDataset) or not (hasattr(split, "__len__") and hasattr(split, "__getitem__")):
        raise UsageError(
            f"{where}: a {type(split).__name__}; expected a map-style torch Dataset (__len__ and __getitem__) "
            "of (image, label) pairs, or a datasets.Dataset"
        )


def _names(dataset: Any) -> tuple[str, ...] | None:
    """torchvision's convention: a `classes` sequence of names."""
    classes = getattr(dataset, "classes", None)
    if isinstance(classes, (list, tuple)) and classes and all(isinstance(c, str) for c in classes):
        return tuple(classes)
    return None


def _layout(dataset: Any, where: str) -> tuple[tuple[int, ...], str]:
    """(image shape, "uint8" or "float") of the first item."""
    if len(dataset) == 0:
        raise DataError(f"{where} is empty")
    image, _ = _item(dataset[0], where, 0)
    if image.ndim == 3 and image.shape[0] > 4 and image.shape[-1] in (1, 3, 4):
        raise DataError(
            f"{where}[0]: an image of shape {tuple(image.shape)} looks channel-last; give (C, H, W) "
            "(image.permute(2, 0, 1))"
        )
    if image.ndim not in (2, 3) or image.dtype == torch.bool or image.is_complex():
        raise DataError(
            f"{where}[0]: an image of shape {tuple(image.shape)} and type {image.dtype}; expected "
            "(H, W) or (C, H, W), uint8 or float"
        )
    return tuple(image.shape), "float" if image.is_floating_point() else "uint8"


def _item(item: Any, where: str, index: int) -> tuple[torch.Tensor, int]:
    """(image tensor, label) of one item; a one-line DataError for anything else."""
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise DataError(f"{where}[{index}]: a {type(item).__name__}; expected an (image, label) pair")
    image, label = item
    if isinstance(image, np.ndarray):
        image = torch.from_numpy(image)
    if not isinstance(image, torch.Tensor):
        raise DataError(f"{where}[{index}]: the image is a {type(image).__name__}; expected a tensor or numpy array")
    if isinstance(label, np.ndarray):
        label = torch.from_numpy(label)
    if isinstance(label, torch.Tensor) and label.numel() == 1 and not label.is_floating_point():
        label = label.reshape(-1)[0].item()
    if isinstance(label, (bool, np.bool_)) or not isinstance(label, (int, np.integer)):
        raise DataError(f"{where}[{index}]: the label is {label!r}; expected an integer class")
    return image, int(label)


def _pixels(image: torch.Tensor, where: str, index: int, shape: tuple[int, ...], kind: str) -> torch.Tensor:
    """The image checked against the first one, as uint8 or float32."""
    if tuple(image.shape) != shape or image.is_floating_point() != (kind == "float"):
        what = "a float" if image.is_floating_point() else "an integer"
        raise DataError(
            f"{where}[{index}]: {what} image of shape {tuple(image.shape)}; item 0 is {kind} of shape {shape}"
        )
    if kind == "float":
        return image.to(torch.float32)
    if image.dtype != torch.uint8:
        low, high = int(image.min()), int(image.max())
        if low < 0 or high > 255:
            raise DataError(f"{where}[{index}]: pixel values {low}..{high}; integer images must be 0..255")
        image = image.to(torch.uint8)
    return image


def _items(dataset: Any, num_workers: int) -> Any:
    # batch_size=None: one item at a time, in order; a generator of its own, so that iterating
    # draws nothing from the global RNG (the built-in model is initialised from it next).
    return DataLoader(dataset, batch_size=None, num_workers=num_workers, generator=torch.Generator())


def _read(
    dataset: Any, where: str, shape: tuple[int, ...], kind: str, keep: bool, num_workers: int,
    stats: PixelStats | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:  # fmt: skip
    """Every item's label, checked, and (with `keep`) the images in one tensor; `stats` counts the pixels."""
    n = len(dataset)
    images = torch.empty((n, *shape), dtype=torch.uint8 if kind == "uint8" else torch.float32) if keep else None
    labels = torch.empty(n, dtype=torch.int64)
    count = 0
    threads = WorkerThreads() if num_workers > 0 else None
    try:
        for index, item in enumerate(_items(dataset, num_workers)):
            image, labels[index] = _item(item, where, index)
            image = _pixels(image, where, index, shape, kind)
            if images is not None:
                images[index] = image
            if stats is not None:
                stats.add(image)
            count += 1
    finally:  # the next split's workers fork next (data/worker_threads.py)
        if threads is not None:
            threads.settle()
    if count != n:
        raise DataError(f"{where}: len() says {n} items but {count} came")
    return images, labels


class ItemDataset(Dataset):
    """A caller's Dataset read item by item, each image checked and normalised as
    ImageTensorDataset normalises its own: the same (C, H, W) float32 values for the same pixels."""

    def __init__(
        self, dataset: Any, where: str, *, shape: tuple[int, ...], kind: str, mean: float, std: float,
        num_classes: int, class_names: Sequence[str] | None,
    ) -> None:  # fmt: skip
        self.dataset, self.where, self.shape, self.kind = dataset, where, shape, kind
        self.mean, self.std = float(mean), float(std)
        self.normalise = Normaliser(mean, std)
        self.num_classes = num_classes
        self.class_names = tuple(class_names) if class_names is not None else None

    @property
    def input_shape(self) -> tuple[int, ...]:
        """(C, H, W) of one sample as the model gets it."""
        return (1, *self.shape) if len(self.shape) == 2 else self.shape

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image, label = _item(self.dataset[index], self.where, index)
        x = self.normalise(_pixels(image, self.where, index, self.shape, self.kind))
        return x.unsqueeze(0) if x.ndim == 2 else x, torch.tensor(label, dtype=torch.int64)


@dataclass(frozen=True)
class ItemSplit(Split):
    """A caller's split not held in memory: its labels, read once, and the Dataset that an
    ItemDataset reads again item by item."""

    source: Any
    shape: tuple[int, ...]
    kind: str

    def dataset(self, **facts: Any) -> Dataset:
        """This split as an ItemDataset, with the classes and normalisation build_datasets settled."""
        return ItemDataset(self.source, self.where, shape=self.shape, kind=self.kind, **facts)
