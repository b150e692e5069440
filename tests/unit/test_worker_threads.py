"""The threads that feed DataLoader workers are waited out before the process may fork again
(accel_mnist/data/worker_threads.py: on CPython before python/cpython#112275's fix, a fork while one
of them ends can deadlock the child), also where a reference cycle holds their loader."""

from __future__ import annotations

from accelerate import Accelerator
from torch.utils.data import DataLoader

from accel_mnist.config import TrainConfig
from accel_mnist.data.catalog import DATASETS, ImageTensorDataset
from accel_mnist.data.worker_threads import WorkerThreads
from accel_mnist.training.loaders import Loaders
from tests.helpers import random_images


def _dataset(n: int) -> ImageTensorDataset:
    images, labels = random_images(n)
    return ImageTensorDataset(images, labels, DATASETS["mnist"].mean, DATASETS["mnist"].std)


def test_settle_waits_out_the_feeders_of_a_loader_only_a_reference_cycle_holds():
    watch = WorkerThreads()
    loader = DataLoader(range(8), batch_size=2, num_workers=1, persistent_workers=True)
    next(iter(loader))
    loader.itself = loader  # type: ignore[attr-defined]  # a cycle: only a collection frees it
    feeders = watch.started()
    assert feeders
    del loader
    assert all(t.is_alive() for t in feeders)  # its workers and their queues are still open
    watch.settle()
    assert not any(t.is_alive() for t in feeders)


def test_closing_the_loaders_ends_every_feeder_the_run_started_the_resumed_epoch_s_too():
    watch = WorkerThreads()
    config = TrainConfig(batch_size=10, eval_batch_size=50, data_loader="torch", num_workers=1)
    accelerator = Accelerator(cpu=True)
    loaders = Loaders(_dataset(60), _dataset(50), config, accelerator)
    assert loaders.kind == "torch"
    next(iter(loaders.epoch(0, skip=2)))  # a resume mid-epoch: a loader of its own, with its own worker
    next(iter(loaders.test))
    loaders.train.itself = loaders.train  # type: ignore[attr-defined]
    assert len(watch.started()) >= 2
    accelerator.free_memory(loaders.train, loaders.test)  # as a run releases them (training/run.py)
    loaders.close()
    assert watch.started() == []
