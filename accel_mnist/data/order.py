"""The order of an epoch: a function of the seed and the epoch alone, shared by both data paths.

`epoch_order` is the permutation the device path (`DeviceLoader`) takes and `EpochSampler` the
sampler of the torch path's training loader, so that both paths train on the same batches. The
order is the one a torch `DataLoader(shuffle=True, generator=g)` gives after
`g.manual_seed(seed + epoch)`: its iterator draws one int64 from `g` (its workers' base seed)
before its `RandomSampler` draws the permutation.

Why a sampler of our own rather than that DataLoader: its order depends on the iterator being
new. A DataLoader whose workers persist reuses its iterator and draws no base seed, so an
epoch's order would depend on whether the workers lived through the earlier epochs, and a
resumed run (a fresh loader) would take other batches than the interrupted one. This sampler
owns its generator, so the training loader's workers can persist: they start once a run
instead of once an epoch, and each start is a `fork()` of a process that runs threads of its
own, which a CPython without the fix of python/cpython#112275 can deadlock (docs/strategies.md).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch.utils.data import Sampler

__all__ = ["EpochSampler", "epoch_order"]


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of `range(n)` for epoch `epoch` of a run seeded `seed`, int64 on the CPU."""
    generator = torch.Generator().manual_seed(seed + epoch)
    # The base-seed draw of torch's _BaseDataLoaderIter.__init__: kept so that runs train on
    # the same batches as the torch path did when it shuffled with DataLoader(shuffle=True).
    torch.empty((), dtype=torch.int64).random_(generator=generator)
    return torch.randperm(n, generator=generator)


class EpochSampler(Sampler[int]):
    """Indices of `range(n)` in `epoch_order(n, seed, epoch)`; `set_epoch` picks the epoch.

    Accelerate's prepared loaders call `set_epoch` of the sampler they wrap with their own
    iteration count, which the loop sets to the epoch before each one (`set_epoch` of the
    prepared loader), so the two agree. It has no `generator` attribute on purpose: Accelerate
    would otherwise synchronise one across processes, which an order computed alike on every
    process does not need.
    """

    def __init__(self, n: int, seed: int) -> None:
        self.n = int(n)
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Yield epoch `epoch`'s order from the next iteration on."""
        self.epoch = int(epoch)

    def __iter__(self) -> Iterator[int]:
        return iter(epoch_order(self.n, self.seed, self.epoch).tolist())

    def __len__(self) -> int:
        return self.n
