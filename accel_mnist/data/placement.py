"""Which data path a run takes, and whether a copy of the data fits where it would go."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import ConfigError

__all__ = ["DATA_LOADERS", "choose_data_loader", "copy_fits", "dataset_nbytes", "device_loader_fits"]

DATA_LOADERS = ("auto", "device", "torch")
HOLDABLE = (torch.uint8, torch.float32)  # the pixel types the device path takes


def dataset_nbytes(dataset: Any) -> int:
    """Bytes the device copy of an ImageTensorDataset-like split takes (images + labels)."""
    return dataset.images.numel() * dataset.images.element_size() + dataset.labels.numel() * 8


def device_loader_fits(device: torch.device | str, nbytes: int, fraction: float = 0.25) -> bool:
    """Whether `nbytes` of data should be held on `device`.

    CPU: always (the data already sits in host memory; the device path only removes the
    per-sample Python work). CUDA: when it takes at most `fraction` of the memory free on
    the device now (MNIST train+test: 55 MB). Other device types: no (not measured).
    """
    device = torch.device(device)
    if device.type == "cpu":
        return True
    if device.type == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(device)
        return nbytes <= fraction * free
    return False


def copy_fits(device: torch.device | str, nbytes: int, fraction: float = 0.25) -> bool:
    """Whether a new copy of `nbytes` should be made on `device`.

    Unlike `device_loader_fits`, on the CPU too: the copy does not exist yet, so it must take at
    most `fraction` of the host memory available now (Linux's MemAvailable; unknown: no).
    """
    device = torch.device(device)
    if device.type != "cpu":
        return device_loader_fits(device, nbytes, fraction)
    available = _host_memory_available()
    return available is not None and nbytes <= fraction * available


def _host_memory_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def choose_data_loader(setting: str, datasets: Any, device: torch.device | str) -> str:
    """Resolve `data_loader: auto|torch|device` to "torch" or "device".

    `datasets` is one split or a sequence of them; "auto" picks "device" when every split
    exposes uint8 or float32 `images` and `labels` tensors (ImageTensorDataset) and they fit on
    `device`. "device" with a dataset that cannot be held raises ConfigError (a ValueError).
    """
    if setting not in DATA_LOADERS:
        raise ConfigError(f"data_loader: '{setting}' is not one of {', '.join(DATA_LOADERS)}")
    if setting == "torch":
        return "torch"
    splits = datasets if isinstance(datasets, (list, tuple)) else [datasets]
    holdable = all(
        isinstance(getattr(s, "images", None), torch.Tensor) and s.images.dtype in HOLDABLE
        and isinstance(getattr(s, "labels", None), torch.Tensor)
        for s in splits
    )  # fmt: skip
    if setting == "device":
        if not holdable:
            raise ConfigError(
                "data_loader: 'device' needs the images as uint8 or float32 tensors in memory; this data is "
                "read item by item (too large to hold here, or not an ImageTensorDataset): use 'auto' or 'torch'"
            )
        return "device"
    if holdable and device_loader_fits(device, sum(dataset_nbytes(s) for s in splits)):
        return "device"
    return "torch"
