"""Per-batch cost of the two ways to serve batches from a split held on the device.

    python -m benchmarks.loader_overhead [--batch-size 64] [--threads 2] [--repeats 5]

  device_loader   accel_mnist's DeviceLoader (index_select on a per-epoch index tensor)
  prepared        an on-device dataset with `__getitems__` (one index_select per batch) in a
                  torch DataLoader prepared by Accelerate like any other: sharding,
                  skip_first_batches and gather_for_metrics would come from Accelerate

Both normalise alike: the whole split once where the DeviceLoader did (a float32 copy fits),
else each batch, so that the difference is the serving alone.

Both yield the same batches (checked here on the first epoch). Prints one JSON line:
median per-batch microseconds of each (median over repeats of each epoch's median
interval between batches) and their difference.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset


class DeviceDataset(Dataset):
    """A split on the device; `__getitems__` cuts a whole batch with one index_select."""

    def __init__(self, split: Any, device: torch.device, normalise_once: bool) -> None:
        self.images, self.labels = split.images.to(device), split.labels.to(device)
        self.consts = tuple(torch.tensor(v, dtype=torch.float32, device=device) for v in (255.0, split.mean, split.std))
        self.device, self.normalised_once = device, normalise_once
        if normalise_once:
            self.images = self.normalise(self.images)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = self.__getitems__([i])
        return x[0], y[0]

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.tensor(indices, dtype=torch.int64).to(self.device, non_blocking=True)
        x = self.images.index_select(0, idx)
        return (x if self.normalised_once else self.normalise(x)), self.labels.index_select(0, idx)

    def normalise(self, images: torch.Tensor) -> torch.Tensor:
        c255, mean, std = self.consts
        return images.to(torch.float32).div_(c255).sub_(mean).div_(std).unsqueeze(1)


def _whole_batch(batch: Any) -> Any:
    return batch  # __getitems__ already returns the collated batch


def per_batch_us(loader: Any) -> float:
    """Median microseconds between consecutive batches of one pass."""
    stamps = [time.perf_counter()]
    for _ in loader:
        stamps.append(time.perf_counter())
    return statistics.median(b - a for a, b in zip(stamps, stamps[1:], strict=False)) * 1e6


def main(argv: list[str] | None = None) -> int:
    """Measure both loaders, interleaved, and print the JSON line."""
    from accelerate import Accelerator

    from accel_mnist.data.catalog import load_datasets
    from accel_mnist.data.device_loader import DeviceLoader
    from benchmarks import benchlib

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    accelerator = Accelerator()
    train, _ = load_datasets("mnist", benchlib.data_dir(), download=False)
    device_loader = DeviceLoader.from_dataset(train, batch_size=args.batch_size, shuffle=True, seed=0,
                                              device=accelerator.device, torch_order=True)  # fmt: skip
    generator = torch.Generator()
    dataset = DeviceDataset(train, accelerator.device, device_loader.normalised_once)
    prepared = accelerator.prepare(DataLoader(dataset, batch_size=args.batch_size, shuffle=True, generator=generator,
                                              collate_fn=_whole_batch))  # fmt: skip
    generator.manual_seed(0)
    device_loader.set_epoch(0)
    same = all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
               for a, b in zip(device_loader, prepared, strict=True))  # fmt: skip
    times: dict[str, list[float]] = {"device_loader": [], "prepared": []}
    for _ in range(args.repeats):
        times["device_loader"].append(per_batch_us(device_loader))
        times["prepared"].append(per_batch_us(prepared))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"device_loader_us_per_batch": med["device_loader"], "prepared_us_per_batch": med["prepared"],
                      "extra_us_per_batch": med["prepared"] - med["device_loader"], "same_batches": same,
                      "batch_size": args.batch_size, "threads": args.threads, "device": accelerator.device.type,
                      "normalised_once": device_loader.normalised_once,
                      "runs_us": times}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
