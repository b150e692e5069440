"""On a GPU: a run's predicted peak (results.json memory.predicted.peak_allocated_bytes) within 10% of
its measured one, the auto batch and the out-of-memory line under a capped allocator, for two model
families: BatchNorm (bncnn, its running statistics) and dropout without normalisation (cnn) (the
whole suite: benchmarks/peak_suite.py)."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from accel_mnist import TrainConfig, train
from accel_mnist.errors import OutOfMemory


@pytest.fixture
def capped():
    device = torch.cuda.current_device()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction((1 << 30) / total, device)  # 1 GiB
    yield
    torch.cuda.set_per_process_memory_fraction(1.0, device)


FAMILIES = pytest.mark.parametrize("model", ["bncnn", "cnn"])


def _config(mnist_dir, tmp_path, model, **changes):
    return TrainConfig(model=model, batch_size=2048, max_steps=3, data_dir=str(mnist_dir), download=False,
                       output_dir=str(tmp_path / "run"), quiet=True, export=False, save_checkpoints=False,
                       plots=False, data_loader="device").replace(**changes)  # fmt: skip


@FAMILIES
def test_the_predicted_peak_is_within_ten_percent_of_the_measured(mnist_dir, tmp_path, model):
    torch.cuda.reset_peak_memory_stats()
    memory = train(_config(mnist_dir, tmp_path, model))["memory"]
    measured = memory["per_process"][0]["peak_allocated_bytes"]
    predicted = memory["predicted"]["peak_allocated_bytes"]
    assert predicted and abs(measured / predicted - 1) <= 0.10, (measured, predicted)
    assert memory["predicted"]["peak_source"] == "probe"  # measured on the GPU, the trace beside it
    assert memory["predicted"]["trace_peak_allocated_bytes"] > 0


@FAMILIES
def test_batch_size_auto_trains_within_a_capped_allocator(mnist_dir, tmp_path, capped, model):
    results = train(_config(mnist_dir, tmp_path, model, batch_size="auto"))
    memory = results["memory"]
    seen = (results["batch_size"], memory["predicted"], memory["per_process"][0]["peak_allocated_bytes"])
    assert results["batch_size"] > 64 and memory["predicted"]["peak_source"] == "probe", seen
    assert memory["per_process"][0]["peak_allocated_bytes"] <= 1 << 30, seen  # it trained: within the cap


@FAMILIES
def test_a_batch_that_does_not_fit_ends_in_the_out_of_memory_line(mnist_dir, tmp_path, capped, model):
    with pytest.raises(OutOfMemory) as excinfo:
        train(_config(mnist_dir, tmp_path, model, batch_size=16384))
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith("out of CUDA memory")
    assert "the estimate: batch" in message and "fits under one process" in message


def test_a_global_batch_is_kept_by_accumulation_within_a_capped_allocator(mnist_dir, tmp_path, capped):
    # 16,384 a step does not fit 1 GiB in one pass: the largest micro-batch that fits and divides it, accumulated.
    results = train(_config(mnist_dir, tmp_path, "cnn", batch_size="auto", global_batch_size=16384))
    ran = json.loads((tmp_path / "run" / "config.json").read_text())  # what ran: --config trains it again
    seen = (results["batch_size"], results["global_batch_size"], ran["grad_accum"])
    assert results["global_batch_size"] == 16384 == ran["batch_size"] * ran["grad_accum"], seen
    assert ran["grad_accum"] > 1, seen
    assert results["memory"]["per_process"][0]["peak_allocated_bytes"] <= 1 << 30, seen


class _BranchOnValues(nn.Module):
    """A forward that cannot run on the meta device: its pooling depends on the batch's mean. The max pool keeps
    int64 indices for the backward (the average pool keeps nothing): 64 x 14 x 14 x 8 bytes a sample more."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 64, 3, padding=1)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.conv(x))
        h = F.max_pool2d(h, 2) if x.mean() > 0 else F.avg_pool2d(h, 2)
        return self.head(h.mean((2, 3)))


def test_a_forward_that_branches_on_its_images_is_probed_on_both_paths(mnist_dir, tmp_path):
    # The first 64 MNIST images' normalised mean is below 0: one draw of them probes the average pool only,
    # while about half of the run's batches of 2048 take the max pool and its indices.
    torch.cuda.reset_peak_memory_stats()
    results = train(_config(mnist_dir, tmp_path, "cnn", max_steps=12), _BranchOnValues())
    memory = results["memory"]
    measured = memory["per_process"][0]["peak_allocated_bytes"]
    predicted = memory["predicted"]["peak_allocated_bytes"]
    assert memory["predicted"]["peak_source"] == "probe"
    assert predicted and abs(measured / predicted - 1) <= 0.10, (measured, predicted)
