"""Models for 28x28 grayscale images: (N, 1, 28, 28) floats -> (N, num_classes) logits.

The loop builds them with the data's number of classes (10 for the MNIST family). Any user
`nn.Module` that returns logits for the data's images (any shape, see model_output.py for what
it may return) works with `train(config, model=...)`; the registry only names the built-in ones
so that configs and exported models can refer to them.
"""

from __future__ import annotations

import copy
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .errors import ConfigError, UsageError

INPUT_SHAPE = (1, 28, 28)  # what every built-in model takes


class Linear(nn.Module):
    """The seed's model: one affine map from 784 pixels to 10 logits."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.fc = nn.Linear(28 * 28, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(x, 1))


class MLP(nn.Module):
    """Fully connected net; `hidden` sets the width of each hidden layer."""

    def __init__(self, hidden: tuple[int, ...] = (512, 256), dropout: float = 0.1, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 28 * 28
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(), nn.Dropout(dropout)]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(torch.flatten(x, 1))


class CNN(nn.Module):
    """The network of pytorch/examples mnist/main.py (two convs, dropout, two linears)."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return self.fc2(x)


class LeNet5(nn.Module):
    """LeCun et al. 1998, with ReLU and max-pooling; padding keeps 28x28 inputs at 32x32's geometry."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(),
            nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes),
        )  # fmt: skip

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


class BNCNN(nn.Module):
    """Three 3x3 conv + BatchNorm + ReLU + max-pool blocks (32, 64, 128 channels), one linear.

    Built for time to accuracy: no dropout and BatchNorm let a high OneCycle learning rate
    reach 99% test accuracy in about one epoch (see recipes/fast99.yaml). `pool_first` pools
    each block's convolution before its BatchNorm and ReLU (the registry's `bncnn_pool`).
    """

    def __init__(
        self, channels: tuple[int, int, int] = (32, 64, 128), num_classes: int = 10, pool_first: bool = False
    ) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = 1
        for c in channels:
            # No conv bias: the BatchNorm that follows has its own shift.
            layers.append(nn.Conv2d(width, c, 3, padding=1, bias=False))
            norm = [nn.BatchNorm2d(c), nn.ReLU()]
            layers += [nn.MaxPool2d(2), *norm] if pool_first else [*norm, nn.MaxPool2d(2)]
            width = c
        self.features = nn.Sequential(*layers)
        self.fc = nn.Linear(width * 3 * 3, num_classes)  # 28 -> 14 -> 7 -> 3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.features(x), 1))


def bncnn_pool(num_classes: int = 10) -> nn.Module:
    """BNCNN with each block pooled before its BatchNorm and ReLU (conv, pool, BatchNorm, ReLU, the order
    of fast CIFAR-10 trainers): BatchNorm and ReLU see a quarter of the elements, forward and backward,
    and on MNIST it reached 99% in fewer steps than BNCNN (docs/measurements.md#modelspy). Another function
    than BNCNN (BatchNorm normalises the pooled values), with the same parameters."""
    return BNCNN(num_classes=num_classes, pool_first=True)


MODELS: dict[str, Callable[..., nn.Module]] = {
    "linear": Linear,
    "mlp": MLP,
    "cnn": CNN,
    "lenet5": LeNet5,
    "bncnn": BNCNN,
    "bncnn_pool": bncnn_pool,
}


def build_model(name: str, mlp_hidden: str | None = None, num_classes: int = 10) -> nn.Module:
    """A freshly initialised model from the registry, with `num_classes` logits; `mlp_hidden`
    ("4096,4096") sets the mlp's widths."""
    if name not in MODELS:
        raise ConfigError(f"model: '{name}' is not one of {', '.join(MODELS)}")
    if mlp_hidden is not None:
        return MLP(check_mlp_hidden(name, mlp_hidden), num_classes=num_classes)
    return MODELS[name](num_classes=num_classes)


def model_from_path(spec: str) -> nn.Module:
    """The model that `package.module:callable` (`spec`) returns, imported alike from the `accel-mnist`
    console script and `python -m accel_mnist`: with the current directory importable. Every command that
    takes a model by that spelling builds it here; a one-line UsageError where it cannot."""
    path, _, name = spec.partition(":")
    with _current_directory_importable():
        try:
            factory = getattr(importlib.import_module(path), name)
        except (ImportError, AttributeError) as exc:
            raise UsageError(f"--model {spec}: cannot import it ({exc})") from None
        module = factory()  # its own imports, done lazily, find the same modules
    if not isinstance(module, nn.Module):
        raise UsageError(f"--model {spec}: {name}() returned a {type(module).__name__}, not a torch.nn.Module")
    return module


@contextmanager
def _current_directory_importable() -> Iterator[None]:
    """The current directory first on sys.path meanwhile, as `python -m` starts with it: a console script
    starts with its own folder there instead, so `mypackage/` beside the user was not found. Left out under
    -P / PYTHONSAFEPATH, as `python -m` leaves it out; sys.path is as it was afterwards."""
    here = os.getcwd()
    if getattr(sys.flags, "safe_path", False) or here in sys.path or "" in sys.path:
        yield
        return
    sys.path.insert(0, here)
    try:
        yield
    finally:
        if here in sys.path:
            sys.path.remove(here)


def check_mlp_hidden(model: str, text: str) -> tuple[int, ...]:
    """The widths of `mlp_hidden` ("4096,4096,4096"); ConfigError unless positive integers for the mlp."""
    if model != "mlp":
        raise ConfigError(f"mlp_hidden: only the mlp has hidden widths to set (model is {model})")
    parts = [part.strip() for part in str(text).split(",")]
    if not all(part.isdigit() and int(part) > 0 for part in parts):
        raise ConfigError(f"mlp_hidden: expected positive integers separated by commas (e.g. 4096,4096), got {text!r}")
    return tuple(int(part) for part in parts)


def mlp_num_parameters(hidden: tuple[int, ...], num_classes: int = 10) -> int:
    """Parameters of MLP(hidden, num_classes=num_classes), from its widths alone (no weights are made)."""
    widths = (28 * 28, *hidden, num_classes)
    return sum(a * b + b for a, b in zip(widths[:-1], widths[1:], strict=True))


def num_parameters(model: nn.Module) -> int:
    """Number of parameters (elements, not tensors)."""
    return sum(p.numel() for p in model.parameters())


def throwaway_copy(model: nn.Module, device: torch.device | None = None, dtype: torch.dtype | None = None) -> nn.Module:
    """A deep copy of `model` for work whose results are thrown away (the prewarm step, the memory probe,
    DeepSpeed's scratch engine): on `device` and in `dtype` where given, as the strategy will hold the real
    one (None: as it is now). The model itself is left untouched."""
    twin = copy.deepcopy(model)
    if device is not None:
        twin = twin.to(device)
    if dtype is not None:
        twin = twin.to(dtype)
    return twin
