"""DataLoaders for training and evaluation, and the arithmetic of how Accelerate shards them."""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, Dataset

from .config import TrainConfig


def build_dataloaders(
    train_set: Dataset, test_set: Dataset, config: TrainConfig
) -> tuple[DataLoader, DataLoader, torch.Generator]:
    """Per-process loaders, and the generator that orders the training set.

    `accelerator.prepare` shards the loaders across processes. Reseeding the generator at the
    start of an epoch fixes that epoch's order, which is what makes mid-epoch resume exact.
    """
    # A seeded generator makes the shuffle order a function of config.seed alone, and
    # Accelerate synchronises it across processes so that shards never overlap.
    generator = torch.Generator().manual_seed(config.seed)
    common = {"num_workers": config.num_workers, "persistent_workers": config.num_workers > 0}
    train_loader = DataLoader(
        train_set, batch_size=config.batch_size, shuffle=True, generator=generator, **common
    )
    test_loader = DataLoader(test_set, batch_size=config.eval_batch_size, shuffle=False, **common)
    return train_loader, test_loader, generator


def batches_per_process(num_samples: int, batch_size: int, num_processes: int) -> int:
    """Batches each process sees per epoch after sharding (Accelerate's even_batches=True)."""
    return math.ceil(math.ceil(num_samples / batch_size) / num_processes)
