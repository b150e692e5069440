"""The "your model, your data" tests' shared pieces: synthetic image data of any number of
classes and any image size, as arrays, an `hf:` folder or a torch Dataset, and models that
return their logits in each way the ecosystem does.

A module of its own, not helpers.py: it imports torch, which conftest.py's every session
should not pay for. Class k lights cell k of a grid of 4x4-pixel cells over noise, so that even
a linear model separates 47 classes within a few dozen steps. Deterministic for a seed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn

# EMNIST's classes: letters (26) and balanced (47: digits, capitals, 11 lower-case letters).
LETTERS = [chr(ord("A") + i) for i in range(26)]
BALANCED = [str(d) for d in range(10)] + LETTERS + list("abdefghnqrt")


def class_images(
    n: int, num_classes: int, seed: int, shape: tuple[int, ...] = (28, 28)
) -> tuple[np.ndarray, np.ndarray]:
    """uint8 images of `shape` ((H, W) or (C, H, W)) and int64 labels 0..num_classes-1."""
    rng = np.random.default_rng(seed)
    height, width = shape[-2:]
    per_row = width // 4
    assert num_classes <= per_row * (height // 4), "too many classes for the image size"
    labels = rng.integers(0, num_classes, size=n)
    images = rng.integers(0, 80, size=(n, *shape), dtype=np.uint8)
    for i, k in enumerate(labels):
        row, col = divmod(int(k), per_row)
        images[i, ..., 4 * row : 4 * row + 4, 4 * col : 4 * col + 4] = rng.integers(200, 256, dtype=np.uint8)
    return images, labels.astype(np.int64)


def splits(num_classes: int, n_train: int = 1500, n_test: int = 400, shape=(28, 28)):
    """{"train": (images, labels), "test": (images, labels)}."""
    return {
        "train": class_images(n_train, num_classes, 0, shape),
        "test": class_images(n_test, num_classes, 1, shape),
    }


def save_hf(path: Path, data: dict, names: list[str] | None = None, num_classes: int | None = None) -> str:
    """`data` (from splits()) as a save_to_disk DatasetDict of PNG images; returns "hf:PATH".

    With `names`, the labels are a ClassLabel of those names; without, plain ints.
    """
    import datasets
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value

    datasets.disable_progress_bars()
    label = ClassLabel(names=names) if names else Value("int64")
    features = Features({"image": Image(), "label": label})
    dd = DatasetDict({
        split: Dataset.from_dict({"image": list(x), "label": y}, features=features) for split, (x, y) in data.items()
    })  # fmt: skip
    dd.save_to_disk(str(path))
    return f"hf:{path}"


class PairDataset(torch.utils.data.Dataset):
    """The arrays as a map-style torch Dataset of (uint8 image tensor, int label), as a project's own."""

    def __init__(self, images: np.ndarray, labels: np.ndarray, classes: list[str] | None = None):
        self.images, self.labels = torch.from_numpy(images), labels
        if classes is not None:
            self.classes = classes

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], int(self.labels[index])


class FloatImages(torch.utils.data.Dataset):
    """The arrays as float images in 0..1 (as torchvision's ToTensor gives them), labels as 0-d tensors."""

    def __init__(self, images: np.ndarray, labels: np.ndarray):
        self.images, self.labels = torch.from_numpy(images).float() / 255, torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.images[index], self.labels[index]


class Net(nn.Module):
    """A linear classifier of 1x28x28 images whose forward wraps its logits as `wrap` says."""

    def __init__(self, wrap=lambda logits: logits):
        super().__init__()
        self.fc = nn.Linear(28 * 28, 10)
        self.wrap = wrap

    def forward(self, x):
        return self.wrap(self.fc(x.flatten(1)))


class WithLogits:
    def __init__(self, logits):
        self.logits = logits


def _model_output(logits):
    from transformers.modeling_outputs import ImageClassifierOutput

    return ImageClassifierOutput(logits=logits)


# Each way a model may return its logits.
WRAPS = {
    "tensor": lambda t: t,
    "model_output": _model_output,
    "dict": lambda t: {"logits": t, "features": t.detach()},
    "object": WithLogits,
    "tuple": lambda t: (t, None),
    "list": lambda t: [t],
}
