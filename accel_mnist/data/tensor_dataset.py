"""The in-memory dataset both data sources produce, the label check they share, and the one
normalisation of pixels that training, the device loader and predict all apply."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from ..errors import DataError


def check_label_range(labels: np.ndarray, n_classes: int, where: str, suffix: str = "") -> None:
    """A one-line DataError naming `where` if any label lies outside 0..n_classes-1."""
    if len(labels) and (labels.min() < 0 or labels.max() >= n_classes):
        bad = int(labels.max()) if labels.max() >= n_classes else int(labels.min())
        raise DataError(f"{where}: label value {bad} out of range 0..{n_classes - 1}{suffix}")


class Normaliser:
    """uint8 pixels -> float32 `(pixels / 255 - mean) / std`, the same ops in the same order everywhere.

    The constants are 0-dim tensors on `device`, not Python scalars: CUDA divides by a CPU scalar
    as a multiplication by its reciprocal (1 ulp off); by a device tensor it divides exactly, so
    a batch normalised on a GPU equals the one normalised on the CPU bit for bit.
    """

    def __init__(self, mean: float, std: float, device: torch.device | str = "cpu") -> None:
        self.mean, self.std = float(mean), float(std)
        self._consts = tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in (255.0, self.mean, self.std))

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        c255, mean, std = self._consts
        return pixels.to(torch.float32).div_(c255).sub_(mean).div_(std)


class ImageTensorDataset(Dataset):
    """(N, 28, 28) uint8 images + int64 labels; yields ((1, 28, 28) float32 normalised, int64 label)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.mean = float(mean)
        self.std = float(std)
        self.normalise = Normaliser(mean, std)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Normalised per item: MNIST train as float32 would be 188 MB per process.
        x = self.normalise(self.images[index])
        # clone(): an indexed element is a view of the whole labels tensor, and pickling it to a
        # DataLoader worker's consumer would ship the entire storage.
        return x.unsqueeze(0), self.labels[index].clone()
