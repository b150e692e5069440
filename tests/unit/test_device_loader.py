"""DeviceLoader: the same batches per process as Accelerate's sharded torch DataLoader."""

from __future__ import annotations

import math
import os

import pytest
import torch
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from accelerate.state import GradientState
from torch.utils.data import BatchSampler, DataLoader

from accel_mnist.data.catalog import DATASETS, ImageTensorDataset, load_split
from accel_mnist.data.device_loader import DeviceLoader
from accel_mnist.data.placement import choose_data_loader, copy_fits, device_loader_fits
from tests.helpers import SYNTHETIC_TEST, equal_to_image_tensor_dataset, random_images

MEAN, STD = DATASETS["mnist"].mean, DATASETS["mnist"].std


def loader(n, batch_size, world, rank, *, shuffle=True, seed=7, drop_last=False, data=None, normalise_once=None):
    images, labels = data if data is not None else random_images(n)
    return DeviceLoader(images, labels, MEAN, STD, batch_size, shuffle=shuffle, seed=seed,
                        num_processes=world, process_index=rank, drop_last=drop_last,
                        register_with_accelerate=False, normalise_once=normalise_once)  # fmt: skip


def reference_batches(order: list[int], batch_size: int, world: int, rank: int, drop_last: bool) -> list[list[int]]:
    """What accelerate.prepare gives process `rank` for a DataLoader over `order`."""
    base = BatchSampler(order, batch_size, drop_last)
    if world == 1:  # prepare_data_loader leaves the batch sampler alone for one process
        return [list(b) for b in base]
    return [list(b) for b in BatchSamplerShard(base, num_processes=world, process_index=rank, even_batches=True)]


CASES = [
    # (N, batch size, world): dividing, not dividing, fewer batches than processes, tiny
    (103, 10, 1), (103, 10, 2), (103, 10, 3), (100, 10, 2), (100, 10, 3), (120, 10, 3),
    (103, 7, 2), (103, 64, 3), (103, 103, 2), (103, 200, 3), (5, 2, 3), (1, 1, 3),
    (103, 1, 3), (96, 16, 3),
]  # fmt: skip


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n, batch_size, world", CASES)
def test_shards_equal_batch_sampler_shard(n, batch_size, world, drop_last):
    if drop_last and n < batch_size * world and world > 1:
        pytest.skip("no full batch per process")
    for rank in range(world):
        dl = loader(n, batch_size, world, rank, drop_last=drop_last)
        order = dl.permutation()
        got = [t.tolist() for t in dl.shard_indices(order)]
        want = reference_batches(order.tolist(), batch_size, world, rank, drop_last)
        assert got == want, (rank, got, want)
        assert len(dl) == len(want)
        if world > 1 and not drop_last:
            assert all(len(b) == batch_size for b in got)  # even_batches: every batch full


@pytest.mark.parametrize("n, batch_size, world", [(60000, 64, 1), (60000, 64, 2), (60000, 64, 3),
                                                  (60000, 512, 8), (10000, 333, 2), (10000, 1000, 3),
                                                  (10000, 1000, 7)])  # fmt: skip
def test_real_size_arithmetic(n, batch_size, world):
    images = torch.zeros(n, 28, 28, dtype=torch.uint8)
    labels = torch.zeros(n, dtype=torch.int64)
    ranks = [loader(n, batch_size, world, r, data=(images, labels)) for r in range(world)]
    # what a prepared torch DataLoader reports (Accelerate's even_batches arithmetic)
    assert len(ranks[0]) == math.ceil(math.ceil(n / batch_size) / world)
    order = ranks[0].permutation()
    for r, dl in enumerate(ranks):
        got = dl.shard_indices(order)
        want = reference_batches(order.tolist(), batch_size, world, r, drop_last=False)
        assert [t.tolist() for t in got] == want
    # every sample is seen at least once per epoch, and only the padding is seen twice
    seen = torch.cat([torch.cat(dl.shard_indices(order)) for dl in ranks])
    assert torch.equal(torch.unique(seen), torch.arange(n))
    expected_len = n if world == 1 else len(ranks[0]) * world * batch_size
    assert len(seen) == expected_len


@pytest.mark.parametrize("normalise_once", [True, False])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_values_equal_prepared_torch_dataloader(world, normalise_once):
    """End to end against accelerate's prepare_data_loader over an ImageTensorDataset."""
    n, batch_size = 103, 10
    images, labels = random_images(n)
    dataset = ImageTensorDataset(images, labels, MEAN, STD)
    for rank in range(world):
        dl = loader(n, batch_size, world, rank, data=(images, labels), normalise_once=normalise_once)
        assert dl.images.dtype == (torch.float32 if normalise_once else torch.uint8)
        order = dl.permutation().tolist()
        torch_dl = prepare_data_loader(
            DataLoader(dataset, batch_size=batch_size, sampler=order), device=torch.device("cpu"),
            num_processes=world, process_index=rank, put_on_device=False,
        )  # fmt: skip
        ours = list(dl)
        theirs = list(torch_dl)
        assert len(ours) == len(theirs) == len(dl) == len(torch_dl)
        for (x, y), (tx, ty) in zip(ours, theirs, strict=True):
            assert x.shape == tx.shape and x.dtype == torch.float32
            assert torch.equal(x, tx)  # bitwise: same float32 ops as ImageTensorDataset
            assert torch.equal(y, ty)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_order_equals_the_reseeded_torch_path(world):
    """With torch_order (default), epoch e equals a shuffling DataLoader whose generator is
    reseeded to seed + e at the epoch's start (the loop's torch path), after prepare()."""
    n, batch_size, seed = 103, 10, 42
    images, labels = random_images(n)
    dataset = ImageTensorDataset(images, labels, MEAN, STD)
    for rank in range(world):
        generator = torch.Generator()
        torch_dl = prepare_data_loader(
            DataLoader(dataset, batch_size=batch_size, shuffle=True, generator=generator),
            device=torch.device("cpu"), num_processes=world, process_index=rank, put_on_device=False,
        )  # fmt: skip
        dl = loader(n, batch_size, world, rank, seed=seed, data=(images, labels))
        for epoch in range(3):
            generator.manual_seed(seed + epoch)
            dl.set_epoch(epoch)
            ours, theirs = list(dl), list(torch_dl)
            assert len(ours) == len(theirs)
            for (x, y), (tx, ty) in zip(ours, theirs, strict=True):
                assert torch.equal(y, ty) and torch.equal(x, tx)


@pytest.mark.parametrize("normalise_once", [True, False])
def test_normalisation_equals_image_tensor_dataset(normalise_once):
    equal_to_image_tensor_dataset("cpu", normalise_once)


def test_normalises_once_only_where_a_float32_copy_fits(monkeypatch):
    import accel_mnist.data.device_loader as device_loader

    asked: list[int] = []

    def fits(answer):
        return lambda device, nbytes: asked.append(nbytes) or answer

    images, labels = random_images(10)
    for answer, dtype in ((True, torch.float32), (False, torch.uint8)):
        monkeypatch.setattr(device_loader, "copy_fits", fits(answer))
        dl = DeviceLoader(images, labels, MEAN, STD, 4, shuffle=False, num_processes=3, process_index=0,
                          register_with_accelerate=False)  # fmt: skip
        assert dl.normalised_once is answer and dl.images.dtype == dtype
    assert asked == [10 * 28 * 28 * 4 * 3] * 2  # 4 bytes a pixel, a copy per CPU process
    assert images.dtype == torch.uint8  # the dataset's own tensor is left alone


def test_copy_fits_judges_host_memory_on_the_cpu():
    assert not copy_fits("cpu", 10**18)
    if os.path.isfile("/proc/meminfo"):  # Linux: its MemAvailable is read
        assert copy_fits("cpu", 10**6)


def test_permutation_changes_with_epoch_and_is_identical_across_ranks():
    ranks = [loader(103, 10, 3, r, seed=5) for r in range(3)]
    first = ranks[0].permutation()
    for dl in ranks:
        assert torch.equal(dl.permutation(), first)
        dl.set_epoch(1)
    second = ranks[0].permutation()
    assert not torch.equal(first, second)
    assert torch.equal(torch.sort(second).values, torch.arange(103))
    assert all(torch.equal(dl.permutation(), second) for dl in ranks)
    # a pure function of (seed, epoch)
    g = torch.Generator().manual_seed(6)
    torch.empty((), dtype=torch.int64).random_(generator=g)
    assert torch.equal(second, torch.randperm(103, generator=g))
    plain = loader(103, 10, 3, 0, seed=5)
    plain.torch_order = False
    assert torch.equal(plain.permutation(1), torch.randperm(103, generator=torch.Generator().manual_seed(6)))
    # the per-epoch shards differ, and together cover everything each epoch
    assert [t.tolist() for t in ranks[0].shard_indices(first)] != [t.tolist() for t in ranks[0].shard_indices()]


def test_epoch_advances_after_a_full_pass_only():
    dl = loader(103, 10, 2, 0)
    assert dl.epoch == 0
    epoch0 = [y for _, y in dl]
    assert dl.epoch == 1 and dl.position == 0
    epoch1 = [y for _, y in dl]
    assert not all(torch.equal(a, b) for a, b in zip(epoch0, epoch1, strict=True))
    it = iter(dl)
    next(it), next(it)
    assert dl.epoch == 2 and dl.position == 2
    del it  # a loop that breaks early stays in its epoch
    assert dl.epoch == 2


def test_not_shuffled_is_in_order():
    dl = loader(103, 10, 1, 0, shuffle=False)
    dl.set_epoch(3)
    assert torch.equal(torch.cat(dl.shard_indices()), torch.arange(103))


@pytest.mark.parametrize("world", [1, 3])
@pytest.mark.parametrize("skip", [0, 1, 4, 5])
def test_resume_mid_epoch_yields_exactly_the_remaining_batches(world, skip):
    for rank in range(world):
        full = loader(103, 7, world, rank)
        full.set_epoch(2)
        everything = list(full)
        assert skip <= len(everything)

        # interrupted run: consume `skip` batches, save, and a new process resumes
        run = loader(103, 7, world, rank)
        run.set_epoch(2)
        it = iter(run)
        for _ in range(skip):
            next(it)
        state = run.state_dict()
        assert state == {"epoch": 2, "position": skip}
        resumed = loader(103, 7, world, rank)
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert len(rest) == len(everything) - skip
        for (x, y), (ex, ey) in zip(rest, everything[skip:], strict=True):
            assert torch.equal(x, ex) and torch.equal(y, ey)
        assert resumed.epoch == 3 and resumed.position == 0
        # the skip is one-shot: the next epoch is whole again
        assert len(list(resumed)) == len(everything)


def test_skip_batches_bounds():
    dl = loader(103, 10, 2, 0)
    with pytest.raises(ValueError):
        dl.skip_batches(len(dl) + 1)
    dl.skip_batches(len(dl))
    assert list(dl) == []


def _gather_for_metrics_emulated(per_rank_batches, remainder, last):
    """accelerate.gather_for_metrics on concatenated per-rank batches (rank order)."""
    gathered = torch.cat(per_rank_batches)
    if last and remainder > 0:
        gathered = gathered[:remainder]
    return gathered


@pytest.mark.parametrize("n, batch_size, world", [(103, 10, 1), (103, 10, 2), (103, 10, 3), (100, 10, 2),
                                                  (10000, 333, 2), (10000, 1000, 3), (10000, 1000, 7),
                                                  (10000, 64, 8), (5, 2, 3), (10000, 3333, 3),
                                                  (7, 2, 3)])  # fmt: skip
def test_eval_counts_every_test_sample_exactly_once(n, batch_size, world):
    images = torch.zeros(n, 28, 28, dtype=torch.uint8)
    labels = torch.arange(n)  # labels = sample index, so we can count
    ranks = [DeviceLoader(images, labels, MEAN, STD, batch_size, shuffle=False, num_processes=world,
                          process_index=r) for r in range(world)]  # fmt: skip
    # The loader tells Accelerate the remainder at the last batch, as gather_for_metrics needs.
    iters = [iter(dl) for dl in ranks]
    seen = []
    for step in range(len(ranks[0])):
        batches = [next(it)[1] for it in iters]
        last = all(dl.end_of_dataloader for dl in ranks)
        assert last == (step == len(ranks[0]) - 1)
        seen.append(_gather_for_metrics_emulated(batches, ranks[0].remainder, last))
    for it in iters:
        assert next(it, None) is None
    seen = torch.cat(seen)
    assert torch.equal(seen, torch.arange(n))  # exactly once, in order


def test_registers_with_accelerate_gradient_state():
    """Iterating registers the loader as Accelerate's active dataloader, like DataLoaderShard."""
    state = GradientState()
    images, labels = random_images(25)
    dl = DeviceLoader(images, labels, MEAN, STD, 10, shuffle=False, num_processes=1, process_index=0)
    assert not state.in_dataloader
    ends = []
    for _ in dl:
        assert state.active_dataloader is dl
        ends.append(state.end_of_dataloader)
        # nested iteration (evaluation inside a training epoch) stacks and unstacks
        inner = DeviceLoader(images, labels, MEAN, STD, 25, shuffle=False)
        for _ in inner:
            assert state.active_dataloader is inner and state.remainder == 0
        assert state.active_dataloader is dl
    assert ends == [False, False, True]
    assert dl.remainder == 25 % 10
    assert not state.in_dataloader
    # breaking early unregisters once the iterator is dropped
    for _ in dl:
        break
    assert not state.in_dataloader


def test_gather_for_metrics_single_process_with_real_accelerator(synthetic_mnist):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True)
    images, labels = load_split("mnist", synthetic_mnist, train=False, download=False)
    assert len(labels) == SYNTHETIC_TEST and SYNTHETIC_TEST % 50  # the last batch is not full
    dl = DeviceLoader(images, labels, MEAN, STD, 50, shuffle=False, device=accelerator.device,
                      num_processes=accelerator.num_processes, process_index=accelerator.process_index)  # fmt: skip
    count = 0
    for _, y in dl:
        count += len(accelerator.gather_for_metrics(y))
    assert count == SYNTHETIC_TEST


def test_joins_gradient_state_only_through_accelerates_public_loader_base():
    """No private GradientState calls in the package: the loader registers through the public
    begin()/end() of accelerate's DataLoaderStateMixin, which its own DataLoaderShard uses."""
    from pathlib import Path

    from accelerate.data_loader import DataLoaderStateMixin

    import accel_mnist

    assert issubclass(DeviceLoader, DataLoaderStateMixin)
    private = ("_add_dataloader", "_remove_dataloader", "_set_sync_gradients", "_reset_state")
    for source in Path(accel_mnist.__file__).parent.rglob("*.py"):
        text = source.read_text()
        assert not [name for name in private if name in text], source.name


def test_batch_size_attribute_and_len():
    dl = loader(
        60000, 64, 2, 1, data=(torch.zeros(60000, 28, 28, dtype=torch.uint8), torch.zeros(60000, dtype=torch.int64))
    )
    assert dl.batch_size == 64
    assert len(dl) == math.ceil(math.ceil(60000 / 64) / 2) == 469


def test_choose_data_loader():
    images, labels = random_images(10)
    ds = ImageTensorDataset(images, labels, MEAN, STD)
    assert device_loader_fits("cpu", 10**9)
    assert choose_data_loader("auto", [ds, ds], "cpu") == "device"
    assert choose_data_loader("torch", [ds], "cpu") == "torch"
    assert choose_data_loader("device", ds, "cpu") == "device"

    class Other(torch.utils.data.Dataset):
        def __len__(self):
            return 1

    assert choose_data_loader("auto", Other(), "cpu") == "torch"
    with pytest.raises(ValueError):
        choose_data_loader("device", Other(), "cpu")
    with pytest.raises(ValueError):
        choose_data_loader("fast", ds, "cpu")


def test_rejects_bad_arguments():
    images, labels = random_images(10)
    with pytest.raises(ValueError):
        DeviceLoader(images.double(), labels, MEAN, STD, 4, shuffle=True)
    with pytest.raises(ValueError):
        DeviceLoader(images, labels[:5], MEAN, STD, 4, shuffle=True)
    with pytest.raises(ValueError):
        DeviceLoader(images, labels, MEAN, STD, 4, shuffle=True, num_processes=2, process_index=2)


def test_rehearsal_leaves_the_epoch_as_it_was():
    """prewarm's rehearsal builds a batch outside the clock; the epoch's batches stay the same."""
    dl, twin = loader(50, 8, 1, 0), loader(50, 8, 1, 0)
    dl.set_epoch(1), twin.set_epoch(1)
    dl.rehearse()
    assert dl.state_dict() == twin.state_dict()
    for (x, y), (tx, ty) in zip(dl, twin, strict=True):
        assert torch.equal(x, tx) and torch.equal(y, ty)
