"""A data path that keeps a whole split on the device and yields normalised batches.

The per-sample torch DataLoader (one `__getitem__`, one collate per sample) caps small
models at a few thousand samples/s; MNIST as uint8 is 47 MB, so the whole split can live
on the accelerator and a batch becomes one gather. Where a float32 copy of the split fits as
well (4 bytes a pixel: 188 MB for MNIST's training split), the split is normalised once at
construction, with the same float32 ops in the same order as ImageTensorDataset (so the values
are equal bit for bit) and a batch is only the gather; otherwise it is kept as uint8 and each
batch is normalised as it is gathered (four more tensor ops a batch, a kernel launch each on a
GPU).

`DeviceLoader` reproduces exactly how `accelerator.prepare` shards a torch DataLoader
(`BatchSamplerShard`, `even_batches=True`, `split_batches=False`):

* batches are cut from the global order (a permutation of the split, or `arange` when not
  shuffled) and dealt round-robin: global batch `j` goes to process `j % num_processes`;
* with more than one process and `drop_last=False`, the order is extended cyclically
  (`order[i % N]`) until every process has the same number of FULL batches, so a final
  partial batch is completed with samples from the start of the order and every batch
  on every process has `batch_size` rows;
* with one process Accelerate does not shard at all: the last batch is partial;
* with `drop_last=True` only the first `(N // B) // P * P` full batches are used.

It also takes part in Accelerate's `GradientState` the way a prepared `DataLoaderShard`
does, through the public `begin()`/`end()` of Accelerate's `DataLoaderStateMixin` (the base
Accelerate gives its own loaders: registered while it is iterated, `end_of_dataloader` set
before the last batch, `remainder = N % (B * P)`), so that, without `accelerator.prepare`:

* `accelerator.gather_for_metrics` drops the wrapped-around duplicates of the last batch
  (without this it would count them: for a loader it did not prepare, Accelerate's
  `GradientState.end_of_dataloader` is False and the gathered duplicates are returned);
* `accelerator.accumulate` syncs gradients at the end of the epoch when the number of
  batches is not a multiple of the accumulation steps, as with a prepared loader.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.data_loader import DataLoaderStateMixin
from accelerate.state import GradientState

from .order import epoch_order
from .placement import HOLDABLE, copy_fits
from .tensor_dataset import Normaliser, check_images

__all__ = ["DeviceLoader"]


class DeviceLoader(DataLoaderStateMixin):
    """The whole split on `device`; yields `(x, y)`: x float32 (B, C, H, W), y int64 (B,).

    Args:
        images: uint8 or float32 tensor (N, H, W) (C = 1, as MNIST's (N, 28, 28)) or
            (N, C, H, W), on any device.
        labels: int64 tensor (N,).
        mean, std: normalisation, x = (img / 255 - mean) / std, or (img - mean) / std for float
            images (as ImageTensorDataset).
        batch_size: per-process batch size.
        shuffle: a new permutation every epoch (False: the split in order, e.g. evaluation).
        seed: epoch `e`'s order is `torch.randperm(N, generator=g)` with
            `g = torch.Generator().manual_seed(seed + e)`, computed on the CPU: identical on
            every process without communication.
        torch_order: first draw one int64 from `g`, as a torch DataLoader iterator does for its
            base seed before its RandomSampler draws the permutation: `order.epoch_order`, the
            order of the loop's torch path (`order.EpochSampler`), so both data paths train
            identically.
        device: where the data lives and batches are produced.
        num_processes, process_index: the data-parallel world (`accelerator.num_processes`,
            `accelerator.process_index`).
        drop_last: drop the final partial batch (as a torch DataLoader with drop_last=True).
        register_with_accelerate: take part in Accelerate's GradientState (see module doc).
        normalise_once: normalise the whole split now (True) or each batch as it is gathered
            (False); None: now where a float32 copy fits (`copy_fits`). The batches are equal.
    """

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        mean: float,
        std: float,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        device: torch.device | str = "cpu",
        num_processes: int = 1,
        process_index: int = 0,
        drop_last: bool = False,
        register_with_accelerate: bool = True,
        torch_order: bool = True,
        normalise_once: bool | None = None,
    ) -> None:
        if images.dtype not in HOLDABLE:
            raise ValueError(f"images must be uint8 or float32, got {images.dtype}")
        check_images(images, labels)
        if len(images) == 0:
            raise ValueError("no samples")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if num_processes < 1 or not 0 <= process_index < num_processes:
            raise ValueError(f"process_index {process_index} out of range for {num_processes} processes")
        self.device = torch.device(device)
        images = images.to(self.device)
        self.labels = labels.to(device=self.device, dtype=torch.int64)
        self.mean = float(mean)
        self.std = float(std)
        self.batch_size = batch_size  # a torch DataLoader's name for it
        self.shuffle = shuffle
        self.seed = int(seed)
        self.num_processes = num_processes
        self.process_index = process_index
        self.drop_last = drop_last
        self.torch_order = torch_order
        self.register_with_accelerate = register_with_accelerate
        # The same Normaliser as ImageTensorDataset's, on the device: equal values bit for bit.
        self._normalise = Normaliser(self.mean, self.std, self.device)
        if normalise_once is None:  # each process on a host keeps a copy of its own
            sharers = num_processes if self.device.type == "cpu" else 1
            normalise_once = copy_fits(self.device, images.numel() * 4 * sharers)
        self.normalised_once = normalise_once
        # (N, C, H, W) float32 normalised, or the images as they came.
        self.images = _with_channels(self._normalise(images)) if normalise_once else images
        self.epoch = 0
        self.position = 0  # batches of the current epoch already yielded
        self._skip = 0  # one-shot: batches to skip at the start of the next iteration
        # What DataLoaderStateMixin.begin() reads: the remainder is len(dataset) % total_batch_size
        # unless _drop_last; its tip asks for the GradientState singleton as self.gradient_state.
        self.dataset = self.labels
        self._drop_last = drop_last
        self.gradient_state = GradientState()
        self.reset()

    @classmethod
    def from_dataset(cls, dataset: Any, **kwargs: Any) -> DeviceLoader:
        """Build from an accel_mnist ImageTensorDataset (its images, labels, mean and std)."""
        return cls(dataset.images, dataset.labels, dataset.mean, dataset.std, **kwargs)

    # -- sizes -----------------------------------------------------------------------------

    @property
    def num_samples(self) -> int:
        """Samples in the split."""
        return len(self.labels)

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes (Accelerate's name)."""
        return self.batch_size * self.num_processes

    def _global_batches(self) -> int:
        n, b = self.num_samples, self.batch_size
        return n // b if self.drop_last else math.ceil(n / b)

    def __len__(self) -> int:
        """Batches per process per epoch (as the prepared torch DataLoader's len())."""
        k, p = self._global_batches(), self.num_processes
        if p == 1:
            return k
        return k // p if self.drop_last else math.ceil(k / p)

    # -- order and sharding ----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Use epoch `epoch`'s permutation from the next iteration on (starting at its beginning)."""
        self.epoch = int(epoch)
        self.position = 0

    def skip_batches(self, n: int) -> None:
        """Make the next iteration start at batch `n` of the current epoch (exact resume)."""
        if not 0 <= n <= len(self):
            raise ValueError(f"cannot skip {n} batches of an epoch of {len(self)}")
        self._skip = int(n)

    def state_dict(self) -> dict[str, int]:
        """Where the loader stands: epoch, and batches of it already yielded."""
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Resume where `state_dict()` was taken: the next iteration yields the remaining batches."""
        self.set_epoch(state["epoch"])
        self.skip_batches(state["position"])

    def permutation(self, epoch: int | None = None) -> torch.Tensor:
        """The global order of epoch `epoch` (default: the current one), int64 on the CPU."""
        n = self.num_samples
        if not self.shuffle:
            return torch.arange(n)
        epoch = self.epoch if epoch is None else epoch
        if self.torch_order:
            return epoch_order(n, self.seed, epoch)
        return torch.randperm(n, generator=torch.Generator().manual_seed(self.seed + epoch))

    def shard_indices(self, order: torch.Tensor | None = None) -> list[torch.Tensor]:
        """This process's batches of the epoch, as index tensors into the split (CPU).

        Exactly Accelerate's BatchSamplerShard(even_batches=True) over BatchSampler(order).
        """
        order = self.permutation() if order is None else order
        n, b, p, r = self.num_samples, self.batch_size, self.num_processes, self.process_index
        k = self._global_batches()
        if p == 1:  # Accelerate does not wrap the batch sampler with one process
            return list(order[: k * b if self.drop_last else n].split(b))
        per_process = len(self)
        total = per_process * p * b
        if self.drop_last:
            padded = order[:total]
        else:  # wrap around to the start of the order so that every batch is full
            padded = order[torch.arange(total) % n]
        return list(padded.view(per_process, p, b)[:, r, :])

    # -- iteration -------------------------------------------------------------------------

    def _batch(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # index_select, not images[idx]: the advanced-indexing path does more work per call.
        x = self.images.index_select(0, idx)
        if not self.normalised_once:
            x = _with_channels(self._normalise(x))
        return x, self.labels.index_select(0, idx)

    def rehearse(self) -> None:
        """Assemble one batch of the first samples as training does, and drop it: no state
        changes, so that the first launches of its kernels happen before the training clock."""
        n = min(self.batch_size, self.num_samples)
        self._batch(torch.arange(n, device=self.device))

    def _index_matrix(self) -> tuple[torch.Tensor, list[int]]:
        """This epoch's shard as one flat index tensor on the device plus per-batch sizes."""
        batches = self.shard_indices()
        sizes = [len(t) for t in batches]
        flat = torch.cat(batches) if batches else torch.empty(0, dtype=torch.int64)
        # One host-to-device copy per epoch; the per-step work is then all on the device.
        return flat.to(self.device, non_blocking=True), sizes

    def _begin(self) -> None:
        if self.register_with_accelerate:
            self.begin()
        else:  # the same remainder, without telling Accelerate
            self.reset()
            self.remainder = -1 if self.drop_last else self.num_samples % self.total_batch_size

    def _end(self) -> None:
        if self.register_with_accelerate:
            self.end()

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        start, self._skip = self._skip, 0
        flat, sizes = self._index_matrix()
        batches = flat.split(sizes)  # views, made in one call: no slicing per step
        last = len(batches) - 1
        self.position = start
        self._begin()
        try:
            for i in range(start, last + 1):
                if i == last:
                    self.end_of_dataloader = True
                batch = self._batch(batches[i])
                self.position = i + 1
                yield batch
        finally:
            self._end()
        # A completed pass moves to the next epoch, as a prepared DataLoaderShard does.
        self.epoch += 1
        self.position = 0

    def __repr__(self) -> str:
        return (
            f"DeviceLoader(samples={self.num_samples}, batch_size={self.batch_size}, "
            f"shuffle={self.shuffle}, process={self.process_index}/{self.num_processes}, "
            f"batches={len(self)}, device={self.device})"
        )


def _with_channels(x: torch.Tensor) -> torch.Tensor:
    """(B, H, W) -> (B, 1, H, W); (B, C, H, W) as it is."""
    return x.unsqueeze(1) if x.ndim == 3 else x
