"""The one line a run ends with out of memory, from explicit numbers (no GPU): the batch it names stays
below the one that failed, the estimate scales by what the run really needed, torch's message is read
for the failing request, and fragmentation is named (the run itself: tests/e2e/test_checkpoint.py)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from accel_mnist.memory.memory_watch import MemoryWatch
from accel_mnist.memory.model_states import Setup
from accel_mnist.memory.out_of_memory import (
    advice,
    fragmentation,
    gpu_parts,
    need_rate,
    needed_at_least,
    out_of_memory_error,
    requested_bytes,
)
from accel_mnist.memory.peak import FIT_SHARE, MIB, PeakInputs, largest_batch, predict_peak, reserved_peak

GIB = 1 << 30
ROOM = 2 * GIB
NUMELS = [1_000_000]  # fp32 Adam on one process: 16 bytes a parameter beside the activations
SETUP = Setup()


def torch_message(asked: str, allocated: str = "1.86 GiB", unallocated: str = "40.00 MiB") -> str:
    """torch 2.14's message (c10/cuda/CUDACachingAllocator.cpp) under a 2 GiB memory fraction."""
    return (f"CUDA out of memory. Tried to allocate {asked}. GPU 0 has a total capacity of 139.81 GiB of which "
            "137.50 GiB is free. 2.00 GiB allowed; Including non-PyTorch memory, this process has 2.20 GiB memory "
            f"in use. Of the allocated memory {allocated} is allocated by PyTorch, and {unallocated} is reserved by "
            "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
            "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-"
            "cuda-alloc-conf)")  # fmt: skip


def watch_at(batch: int) -> MemoryWatch:
    """A MemoryWatch as the run leaves it: 1 MiB of training activations a sample, traced at `batch`."""
    inputs = PeakInputs(train_activation_bytes=batch * MIB, eval_activation_bytes=0, traced_batch=batch)
    watch = MemoryWatch(SimpleNamespace(device=torch.device("cuda")), None, None, {})
    watch.numels, watch.setup, watch.peak = NUMELS, SETUP, inputs
    watch.predicted["peak_allocated_bytes"] = predict_peak(NUMELS, SETUP, inputs)
    return watch


def named_batch(line: str) -> int:
    return int(re.search(r"batch (\d+) per process", line)[1])


def test_the_batch_named_stays_below_the_one_that_failed_where_the_estimate_says_it_fits():
    watch, room = watch_at(1600), 3 * GIB  # room for 1600 with the allocator's share for fragmentation
    assert largest_batch(NUMELS, SETUP, watch.peak, room) == 1789  # the estimate alone: 1600 fits
    line = advice(watch, 1600, room)
    assert named_batch(line) == 1599 < 1600
    assert line == ("batch 1599 per process at most under one process (the estimate said 1789, but 1600 failed); "
                    "at batch 1600: fsdp, fsdp_offload")  # fmt: skip
    # ddp on one process is this very strategy, which just failed at this batch: not offered again.
    assert "ddp" not in line
    assert advice(watch, 1, room).startswith("no batch fits under one process (the estimate said 1789, but 1 failed)")


def test_a_need_above_the_prediction_scales_the_batch_down_by_that_factor():
    watch = watch_at(1600)
    predicted = watch.predicted["peak_allocated_bytes"]
    rate = need_rate(predicted, int(1.5 * predicted))
    assert rate == pytest.approx(1.5) and need_rate(predicted, predicted - 1) == 1.0 == need_rate(None, 5)
    implied = named_batch(advice(watch, 1600, ROOM, rate))
    assert implied < 1600 and implied < named_batch(advice(watch, 10**6, ROOM))
    # The batch the measured need implies: the prediction times the rate fits there, not one sample more.
    assert reserved_peak(NUMELS, SETUP, watch.peak.at_batch(implied)) * rate <= FIT_SHARE * ROOM
    assert reserved_peak(NUMELS, SETUP, watch.peak.at_batch(implied + 1)) * rate > FIT_SHARE * ROOM


def test_the_line_says_how_much_more_the_run_needed_and_what_batch_that_implies():
    watch = watch_at(1600)  # predicted 1.64 GiB
    peak, held = int(1.86 * GIB), int(1.95 * GIB)
    parts = gpu_parts(watch, 1600, ROOM, held, peak, torch_message("300.00 MiB"), {})
    assert parts == [
        "the allocator may use 2 GiB of this GPU and held 1.95 GiB",
        "the run needed at least 2.15 GiB, 31% above the predicted 1.64 GiB",
        "at that rate batch 882 per process would fit under one process; no other strategy fits at batch 1600",
    ]
    # Where the need is not above the prediction, the estimate stands (below the failed batch).
    low = gpu_parts(watch, 1600, ROOM, held, GIB, torch_message("20.00 MiB", "1.00 GiB", "10.00 MiB"), {})
    assert low[1].startswith("the estimate: batch 1174 per process fits under one process")


def test_the_need_is_what_was_allocated_as_it_failed_plus_the_request():
    message = torch_message("300.00 MiB", allocated="1.00 GiB")
    # The message's allocated bytes, not the peak, which may be an earlier moment's or an earlier run's.
    assert needed_at_least(int(1.5 * GIB), message) == needed_at_least(GIB // 2, message) == GIB + 300 * MIB
    # Without what was allocated (a shorter message), the peak stands in for the moment of failure.
    assert needed_at_least(GIB, "CUDA out of memory. Tried to allocate 2.00 GiB") == 3 * GIB
    assert needed_at_least(GIB, "") == GIB


@pytest.mark.parametrize(("asked", "expected"), [
    ("2.00 GiB", 2 * GIB), ("20.00 MiB", 20 * MIB), ("512.00 KiB", 512 << 10), ("1.50 GiB", 3 * GIB // 2),
    ("1024 bytes", 1024),
])  # fmt: skip
def test_the_failing_request_is_read_from_torchs_message(asked, expected):
    assert requested_bytes(torch_message(asked)) == expected
    assert requested_bytes(f"CUDA out of memory. Tried to allocate {asked}") == expected  # the e2e test's short form


def test_a_message_without_a_request_has_none():
    assert requested_bytes("CUDA error: out of memory") is None
    assert requested_bytes("CUDA out of memory. Tried to allocate more than 1EB memory.") is None
    assert requested_bytes("") is None
    # A per-process memory fraction's refusal names the request otherwise.
    fraction = ("CUDA out of memory. Allocation was preemptively rejected because it would exceed "
                "per_process_memory_fraction limit. Requested size: 2.00 GiB.")  # fmt: skip
    assert requested_bytes(fraction) == 2 * GIB


def test_fragmentation_is_named_where_large_and_expandable_segments_suggested_only_where_unset():
    # Less than the estimate's share for it and less than the request: not worth a word.
    assert fragmentation(100 * MIB, ROOM, 300 * MIB, {}) is None
    said = fragmentation(700 * MIB, ROOM, 300 * MIB, {})
    assert said == ("700 MiB held but not allocated (fragmentation): "
                    "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")  # fmt: skip
    assert fragmentation(100 * MIB, ROOM, 80 * MIB, {}) is not None  # enough for the request, had it been one block
    for env in ({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128,expandable_segments:True"},
                {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}):  # fmt: skip
        assert fragmentation(700 * MIB, ROOM, 300 * MIB, env) == (
            "700 MiB held but not allocated (fragmentation), even with expandable segments"
        )
    off = fragmentation(700 * MIB, ROOM, None, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})
    assert off is not None and off.endswith("try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")


def test_a_fragmented_run_below_its_prediction_is_told_so_from_torchs_message():
    watch = watch_at(1600)
    message = torch_message("300.00 MiB", allocated="1.20 GiB", unallocated="700.00 MiB")
    parts = gpu_parts(watch, 1600, ROOM, int(1.95 * GIB), int(1.2 * GIB), message, {})
    assert parts[1] == ("700 MiB held but not allocated (fragmentation): "
                        "try PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")  # fmt: skip
    assert named_batch(parts[2]) < 1600


def test_without_a_prediction_the_line_says_why():
    cpu = SimpleNamespace(device=torch.device("cpu"))
    watch = MemoryWatch(cpu, None, None, {"peak_allocated_bytes": None})
    line = str(out_of_memory_error(cpu, 64, watch, 3, None))
    assert line.startswith("out of CPU memory after step 3 at batch 64 per process; peak not predicted (its forward")
    watch.predicted["peak_unpredicted"] = "cannot predict: the probe ran out of memory"
    error = out_of_memory_error(cpu, 64, watch, 0, None)
    assert error.exit_code == 3 and "\n" not in str(error)
    assert "; peak not predicted (cannot predict: the probe ran out of memory) (no checkpoint was written" in str(error)
    assert "peak not predicted yet" in str(out_of_memory_error(cpu, 64, None, None, None))
