"""The torch path's training order: a function of seed and epoch alone, with workers that persist.

The loop's training DataLoader keeps its workers for the whole run (`persistent_workers`), which
reuses one iterator across epochs. These check that the batches are still those of the device
path and of the shuffling DataLoader the torch path used before, epoch after epoch, and that a
fresh loader resumed mid-epoch takes exactly the batches the uninterrupted one took.
"""

from __future__ import annotations

import os

import pytest
import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from accel_mnist.config import TrainConfig
from accel_mnist.data.catalog import DATASETS, ImageTensorDataset
from accel_mnist.data.device_loader import DeviceLoader
from accel_mnist.data.order import EpochSampler, epoch_order
from accel_mnist.training.loaders import Loaders
from tests.helpers import random_images

# One module-scoped Accelerator: its tests stay on one xdist worker.
pytestmark = pytest.mark.xdist_group("unit/test_epoch_order.py")

MEAN, STD = DATASETS["mnist"].mean, DATASETS["mnist"].std
N, BATCH, SEED = 103, 10, 42


def _labels(batches) -> list[list[int]]:
    return [y.tolist() for _x, y in batches]


def _dataset(n: int = N) -> ImageTensorDataset:
    images, _ = random_images(n)
    # Labels that name their sample: a batch's labels are its indices.
    return ImageTensorDataset(images, torch.arange(n), MEAN, STD)


def test_epoch_order_is_the_reseeded_shuffling_dataloaders():
    """Epoch e's order equals DataLoader(shuffle=True, generator=g) with g reseeded to seed + e."""
    generator = torch.Generator()
    reference = DataLoader(range(N), batch_size=N, shuffle=True, generator=generator)
    for epoch in range(3):
        generator.manual_seed(SEED + epoch)
        (expected,) = list(reference)
        assert epoch_order(N, SEED, epoch).tolist() == expected.tolist()
    assert epoch_order(N, SEED, 0).tolist() != epoch_order(N, SEED, 1).tolist()


def test_sampler_follows_set_epoch_and_nothing_else():
    sampler = EpochSampler(N, SEED)
    first = list(sampler)
    assert list(sampler) == first  # iterating again does not move on
    sampler.set_epoch(2)
    assert list(sampler) == epoch_order(N, SEED, 2).tolist() and len(sampler) == N
    assert not hasattr(sampler, "generator")  # Accelerate would synchronise one across processes


@pytest.fixture(scope="module")
def accelerator():
    return Accelerator(cpu=True)


@pytest.mark.parametrize("workers", [0, 1])
def test_torch_path_with_persistent_workers_equals_the_device_path(accelerator, workers):
    """Three epochs through one loader (one iterator reused when workers persist): the batches of
    each equal the DeviceLoader's for that epoch."""
    dataset = _dataset()
    config = TrainConfig(batch_size=BATCH, eval_batch_size=50, seed=SEED, data_loader="torch", num_workers=workers)
    loaders = Loaders(dataset, _dataset(50), config, accelerator)
    assert loaders.kind == "torch"
    assert loaders.train.persistent_workers == (workers > 0)
    device = DeviceLoader.from_dataset(dataset, batch_size=BATCH, shuffle=True, seed=SEED,
                                       register_with_accelerate=False)  # fmt: skip
    for epoch in range(3):
        device.set_epoch(epoch)
        assert _labels(loaders.epoch(epoch)) == _labels(device), f"epoch {epoch}"


def test_a_resumed_loader_takes_the_batches_the_whole_run_took(accelerator):
    """Stopped after 4 batches of epoch 1, a fresh loader skipping 4 gives the rest of epoch 1,
    then epoch 2, as the loader that lived through epochs 0 and 1."""
    dataset = _dataset()
    config = TrainConfig(batch_size=BATCH, eval_batch_size=50, seed=SEED, data_loader="torch", num_workers=1)
    whole = Loaders(dataset, _dataset(50), config, accelerator)
    seen = [_labels(whole.epoch(epoch)) for epoch in range(3)]
    resumed = Loaders(dataset, _dataset(50), config, accelerator)
    assert _labels(resumed.epoch(1, skip=4)) == seen[1][4:]
    assert _labels(resumed.epoch(2)) == seen[2]


class _WhoServes(torch.utils.data.Dataset):
    """Each sample's label is the id of the process that read it."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, index: int):
        return torch.zeros(1, 28, 28), os.getpid()


def test_training_workers_start_once_a_run(accelerator):
    """Workers persist: three epochs are read by the same worker process (a new one per epoch
    would be a new fork of a process that runs threads, python/cpython#112275)."""
    config = TrainConfig(batch_size=BATCH, eval_batch_size=50, seed=SEED, data_loader="torch", num_workers=1)
    loaders = Loaders(_WhoServes(), _dataset(50), config, accelerator)
    readers = {pid for epoch in range(3) for _x, y in loaders.epoch(epoch) for pid in y.tolist()}
    assert len(readers) == 1 and readers != {os.getpid()}
