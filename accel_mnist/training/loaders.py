"""The two data paths, behind one interface: Accelerate-prepared torch DataLoaders, or the
whole split held on the device (`DeviceLoader`), which shards exactly as Accelerate does.

Both give every process the same batches in the same order for a given seed and epoch, so a
run's metrics do not depend on the path (a test checks this); the device path only removes
the per-sample Python work that limits small models.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader

from ..config import TrainConfig
from ..data.device_loader import DeviceLoader
from ..data.order import EpochSampler
from ..data.placement import choose_data_loader
from ..data.worker_threads import WorkerThreads
from ..distributed.consensus import agree


class Loaders:
    """Training and evaluation batches for this process, whichever path holds the data."""

    def __init__(self, train_set: Any, test_set: Any, config: TrainConfig, accelerator: Accelerator) -> None:
        # Agreed: "device" for data one rank could not hold stops every rank with its error.
        kind = agree(
            accelerator, lambda: choose_data_loader(config.data_loader, [train_set, test_set], accelerator.device)
        )
        # Each process judges "fits" by its own device's free memory, but all must take the same
        # path: the torch path's loaders synchronise RNG states, a collective the other lacks.
        votes = accelerator.gather(torch.tensor([kind == "device"], device=accelerator.device))
        self.kind = "device" if bool(votes.all()) else "torch"
        self.accelerator = accelerator
        self.threads: WorkerThreads | None = None  # the torch path's with workers (close waits them out)
        self.skipping: Any = None  # the loader that resumes mid-epoch, kept until close (its workers persist)
        if self.kind == "device":
            common = {"device": accelerator.device, "num_processes": accelerator.num_processes,
                      "process_index": accelerator.process_index}  # fmt: skip
            self.train: Any = DeviceLoader.from_dataset(
                train_set, batch_size=config.batch_size, shuffle=True, seed=config.seed, **common
            )
            self.test: Any = DeviceLoader.from_dataset(
                test_set, batch_size=config.eval_batch_size, shuffle=False, **common
            )
            return
        # An epoch's order is a function of seed and epoch alone (EpochSampler), the same on
        # every process and the device path's, whatever the loader's history: so the workers
        # persist, started once a run rather than forked again at every epoch (order.py: why
        # each fork costs more than its time). The loader's own generator only seeds the
        # workers, and keeps the global RNG out of it.
        self.sampler = EpochSampler(len(train_set), config.seed)
        self.threads = WorkerThreads() if config.num_workers > 0 else None
        train = DataLoader(train_set, batch_size=config.batch_size, sampler=self.sampler,
                           generator=torch.Generator().manual_seed(config.seed), num_workers=config.num_workers,
                           persistent_workers=config.num_workers > 0)  # fmt: skip
        # Its own generator too: iterating a DataLoader draws a seed, which would otherwise come
        # from the global RNG and shift the dropout masks of the training after each evaluation.
        # Unshuffled, so its workers may persist across evaluations.
        test = DataLoader(test_set, batch_size=config.eval_batch_size, shuffle=False, generator=torch.Generator(),
                          num_workers=config.num_workers, persistent_workers=config.num_workers > 0)  # fmt: skip
        self.train, self.test = accelerator.prepare(train, test)

    def close(self) -> None:
        """End the torch path's worker processes now, and wait out the threads that fed them
        (data/worker_threads.py): left to some later garbage collection, they would end while the process
        goes on, perhaps while it forks the workers of its next run, a fork that CPython before
        python/cpython#112275's fix can deadlock."""
        # The last references once the Accelerator let go of them (free_memory): their iterators shut the
        # workers down as they are freed.
        self.train = self.test = self.skipping = None
        if self.threads is not None:
            self.threads.settle()

    def device_bytes(self) -> int:
        """Bytes the loaders hold on the device for the whole run: both splits on the device path, else 0."""
        if self.kind != "device":
            return 0
        held = (self.train.images, self.train.labels, self.test.images, self.test.labels)
        return sum(t.untyped_storage().nbytes() for t in held)

    def rehearse(self) -> None:
        """Build one training batch the way the device path does, outside the clock (see
        prewarm); the torch path's batches come from the CPU, with nothing to rehearse."""
        if self.kind == "device":
            self.train.rehearse()

    def __len__(self) -> int:
        """Training batches per process per epoch."""
        return len(self.train)

    def epoch(self, epoch: int, skip: int = 0) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """Epoch `epoch`'s batches for this process, starting after the first `skip` (resume)."""
        if self.kind == "device":
            self.train.set_epoch(epoch)
            self.train.skip_batches(skip)
            return self.train
        # Accelerate hands its loader's iteration count to the sampler as it starts an
        # iteration; set here, both say `epoch`, also in the loader that skips for a resume.
        self.train.set_epoch(epoch)
        self.sampler.set_epoch(epoch)
        if not skip:
            return self.train
        # Held here until close: dropped at the epoch's end, its workers' feeder threads would end mid-run.
        self.skipping = self.accelerator.skip_first_batches(self.train, skip)
        return self.skipping
