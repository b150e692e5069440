"""The in-memory dataset the loop trains on, the one place that builds a (train, test) pair of
datasets from what a source read (classes, label check, normalisation), and the one
normalisation of pixels that training, the device loader and predict all apply."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataError, UsageError


def check_label_range(labels: np.ndarray, n_classes: int, where: str, suffix: str = "") -> None:
    """A one-line DataError naming `where` if any label lies outside 0..n_classes-1."""
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        bad = int(labels.max()) if labels.max() >= n_classes else int(labels.min())
        raise DataError(f"{where}: label value {bad} out of range 0..{n_classes - 1}{suffix}")


class PixelStats:
    """Mean and (population) std of pixels, gathered batch by batch: uint8 pixels count / 255 in a
    256-bin histogram (exact, and without a float copy: MNIST's training split would be 376 MB),
    float pixels as they are, in float64 sums. Rounded to 4 decimals: the convention behind the
    usual constants, so MNIST from any source gets exactly 0.1307/0.3081."""

    def __init__(self) -> None:
        self.counts = np.zeros(256, dtype=np.int64)
        self.n, self.total, self.squares = 0, 0.0, 0.0

    def add(self, pixels: torch.Tensor) -> None:
        """Count the pixels of one image or batch."""
        if pixels.dtype == torch.uint8:
            self.counts += np.bincount(pixels.cpu().numpy().reshape(-1), minlength=256)
        else:
            values = pixels.detach().reshape(-1).double()
            self.n += values.numel()
            self.total += values.sum().item()
            self.squares += values.square().sum().item()

    def mean_std(self) -> tuple[float, float]:
        """(mean, std) of everything added; std 1.0 where the pixels are all alike."""
        if self.n:  # float pixels (a source gives one kind only)
            mean = self.total / self.n
            var = max(self.squares / self.n - mean * mean, 0.0)
        else:
            total = self.counts.sum()
            if total == 0:
                return 0.0, 1.0
            values = np.arange(256, dtype=np.float64) / 255.0
            mean = float((self.counts * values).sum() / total)
            var = float((self.counts * (values - mean) ** 2).sum() / total)
        std = round(var**0.5, 4)
        return round(mean, 4), std if std > 0 else 1.0


def pixel_mean_std(images: torch.Tensor, batch: int = 10000) -> tuple[float, float]:
    """Mean and std of the pixels of `images` (see PixelStats), rounded to 4 decimals."""
    stats = PixelStats()
    for start in range(0, len(images), batch):
        stats.add(images[start : start + batch])
    return stats.mean_std()


class Normaliser:
    """Pixels -> float32 `(pixels / 255 - mean) / std` for uint8, `(pixels - mean) / std` for
    floats (already 0..1, as torchvision's ToTensor gives them): the same ops in the same order
    everywhere.

    The constants are 0-dim tensors on `device`, not Python scalars: CUDA divides by a CPU scalar
    as a multiplication by its reciprocal (1 ulp off); by a device tensor it divides exactly, so
    a batch normalised on a GPU equals the one normalised on the CPU bit for bit.
    """

    def __init__(self, mean: float, std: float, device: torch.device | str = "cpu") -> None:
        self.mean, self.std = float(mean), float(std)
        self._consts = tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in (255.0, self.mean, self.std))

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        c255, mean, std = self._consts
        if pixels.dtype == torch.uint8:
            return pixels.to(torch.float32).div_(c255).sub_(mean).div_(std)
        # Out of place first: `to` returns a float32 input itself, which must not change.
        return pixels.to(torch.float32).sub(mean).div_(std)


def check_images(images: torch.Tensor, labels: torch.Tensor) -> None:
    """Raise ValueError unless `images` is (N, H, W) or (N, C, H, W) with one label each."""
    if images.ndim not in (3, 4):
        raise ValueError(f"images must be (N, H, W) or (N, C, H, W), got {tuple(images.shape)}")
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")


class ImageTensorDataset(Dataset):
    """uint8 or float32 images, (N, H, W) or (N, C, H, W), + int64 labels; yields
    ((C, H, W) float32 normalised, int64 label), C = 1 for (N, H, W).

    `num_classes` (default: the largest label + 1) and `class_names` are the data's classes,
    which the loop sizes models and confusion matrices by.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: float,
        std: float,
        *,
        num_classes: int | None = None,
        class_names: Sequence[str] | None = None,
    ):
        check_images(images, labels)
        self.images = images
        self.labels = labels
        self.mean = float(mean)
        self.std = float(std)
        self.normalise = Normaliser(mean, std)
        self.class_names = tuple(class_names) if class_names is not None else None
        if num_classes is None:
            num_classes = len(self.class_names) if self.class_names else int(labels.max()) + 1 if len(labels) else 0
        self.num_classes = num_classes

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """(C, H, W) of one sample as the model gets it."""
        return (1, *self.images.shape[1:]) if self.images.ndim == 3 else tuple(self.images.shape[1:])  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Normalised per item: MNIST train as float32 would be 188 MB per process.
        x = self.normalise(self.images[index])
        # clone(): an indexed element is a view of the whole labels tensor, and pickling it to a
        # DataLoader worker's consumer would ship the entire storage.
        return x.unsqueeze(0) if x.ndim == 2 else x, self.labels[index].clone()


@dataclass(frozen=True)
class Split:
    """One split as a source read it: uint8 or float images in memory (None in a split whose images
    are read again item by item, own.ItemSplit), int64 labels, and what its errors call it (a
    file, a column, an argument)."""

    images: torch.Tensor | None
    labels: torch.Tensor
    where: str

    def dataset(self, **facts: Any) -> Dataset:
        """This split as a dataset, with the classes and normalisation `build_datasets` settled."""
        assert self.images is not None  # an ItemSplit, the one kind without, makes its own dataset
        return ImageTensorDataset(self.images, self.labels, **facts)


def _no_note(count: int) -> str:
    return ""


@dataclass(frozen=True)
class Splits:
    """Both splits as a source read them, nothing yet checked against the classes: the class names
    where the source has them, the normalisation where it knows one (a catalog's constants), and
    what a label error adds about where the number of classes came from."""

    train: Split
    test: Split
    class_names: tuple[str, ...] | None = None
    mean: float | None = None
    std: float | None = None
    note: Callable[[int], str] = _no_note


def check_normalisation(mean: float | None, std: float | None) -> None:
    """A one-line UsageError unless `mean` and `std` are both None, or both numbers with std > 0."""
    if (mean is None) != (std is None):
        raise UsageError("mean and std go together: pass both, or neither to take them from the training data")
    if std is not None and not (isinstance(std, (int, float)) and isinstance(mean, (int, float)) and std > 0):
        raise UsageError(f"mean and std must be numbers, std > 0; got mean={mean!r}, std={std!r}")


def build_datasets(splits: Splits, mean: float | None = None, std: float | None = None) -> tuple[Any, Any]:
    """The (train, test) datasets of what a source read, built in this one place for every source.

    The classes are the source's names, else 0..the largest training label; every label of both
    splits must lie among them. The normalisation is `mean`/`std` where given (the caller's),
    else the source's, else the mean and std of the training pixels (see PixelStats).
    """
    check_normalisation(mean, std)
    names = splits.class_names
    labels = splits.train.labels
    count = len(names) if names else max(int(labels.max()) + 1 if len(labels) else 0, 1)
    for split in (splits.train, splits.test):
        check_label_range(split.labels.numpy(), count, split.where, suffix=splits.note(count))
    if mean is None or std is None:
        mean, std = splits.mean, splits.std
    if mean is None or std is None:
        assert splits.train.images is not None  # a split read item by item comes with its mean and std
        mean, std = pixel_mean_std(splits.train.images)
    facts: dict[str, Any] = {"mean": mean, "std": std, "num_classes": count, "class_names": names}
    return splits.train.dataset(**facts), splits.test.dataset(**facts)
