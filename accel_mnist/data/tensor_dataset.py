"""The in-memory dataset both data sources produce, and the label check they share."""

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


class ImageTensorDataset(Dataset):
    """(N, 28, 28) uint8 images + int64 labels; yields ((1, 28, 28) float32 normalised, int64 label)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, mean: float, std: float):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images = images
        self.labels = labels
        self.mean = float(mean)
        self.std = float(std)

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # Normalised per item: MNIST train as float32 would be 188 MB per process.
        x = self.images[index].to(torch.float32).div_(255.0).sub_(self.mean).div_(self.std)
        # clone(): an indexed element is a view of the whole labels tensor, and pickling it to a
        # DataLoader worker's consumer would ship the entire storage.
        return x.unsqueeze(0), self.labels[index].clone()
