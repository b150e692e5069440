"""The activation memory of a run measured on its GPU: a few real steps of a throwaway copy.

The meta-device trace (activations.py) counts the tensors torch returns, not what kernels allocate
for themselves: cuDNN's RNN reserve and workspaces, SDPA's flash and memory-efficient paths that
never hold the attention matrix, a convolution's workspace. Against the allocator the trace misses
by tens of percent either way, RNNs above it and attention models below (measured:
docs/measurements.md#memoryprobepy; docs/memory.md, "Models users bring: the probe"). Where a GPU is
present the run measures instead: before the training clock starts and before `prepare`, a copy of
the model on the device, in the run's precision (the 16-bit weights DeepSpeed keeps, else fp32 under
the run's autocast) and memory format, takes a forward and backward pass at three small batches (and
an evaluation forward at three), each shape once to warm up and once measured, the allocator's peak
read around it. Activation bytes are close to linear in the batch, so a line through the three
points gives the bytes at any batch; a point more than OFF_LINE from the line marks the measurement
as untrustworthy.

What the strategy adds (its model states, DeepSpeed's buckets, FSDP's unsharded copies) still
comes from peak.py's terms, which are exact or checked; only the activation terms change.
What it costs: a copy of the model's parameters and gradients on the device while it runs,
and its seconds (`probe_seconds` in results.json, off `train_seconds`); the run's model,
buffers and random streams are untouched. Without a GPU there is nothing to measure and the
trace stays, the weaker of the two.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
from torch import nn

from ..models import throwaway_copy
from .allocator import capacity

PROBE_LIMIT = 1024  # the largest batch probed: a few hundred MiB for the built-in models
OFF_LINE = 0.10  # a probed point this far (relative) from the fitted line: the line is not trusted


@dataclass(frozen=True)
class Line:
    """Bytes at a batch, fitted through measured points: `fixed + per_sample * batch`."""

    fixed: float
    per_sample: float
    off_line: float  # the largest relative distance of a measured point from the line

    def at(self, batch: int) -> int:
        """The line's bytes at `batch` (never below zero)."""
        return max(0, round(self.fixed + self.per_sample * batch))


@dataclass(frozen=True)
class Probe:
    """What the probe measured: training and evaluation activation bytes as lines in the batch."""

    train: Line
    evaluate: Line
    batches: tuple[int, ...]
    seconds: float

    @property
    def untrusted(self) -> str | None:
        """Why the lines cannot be extrapolated (None: they can)."""
        worst = max(self.train.off_line, self.evaluate.off_line)
        if worst > OFF_LINE:
            return f"the probed activation bytes are not linear in the batch (a point {worst:.0%} off the line)"
        return None


def probe_batches(batch: int | None, limit: int = PROBE_LIMIT) -> tuple[int, ...]:
    """Three batches to probe for a run at `batch` (None: not chosen yet), the largest at most `limit`."""
    top = min(batch or 256, limit)
    return tuple(sorted({max(1, top // 4), max(1, top // 2), top}))


def fit(points: Sequence[tuple[int, int]]) -> Line:
    """The least-squares line through (batch, bytes) points, and how far the farthest lies from it, relative to
    the largest point (a MiB of workspace wobble at a small batch is no bend)."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    fixed = mean_y - slope * mean_x
    scale = max((abs(y) for _, y in points), default=1) or 1
    off = max((abs(y - (fixed + slope * x)) / scale for x, y in points), default=0.0)
    return Line(fixed, slope, off)


def available(device: torch.device) -> int:
    """Bytes this process's allocator can still reach on `device`: free on the GPU plus what it holds,
    within a per-process memory fraction where one is set."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    free, _total = torch.cuda.mem_get_info(index)
    cap = capacity(torch.device("cuda", index))  # the card times this process's fraction: one rule
    return min(cap or 0, free + torch.cuda.memory_reserved(index))


def measure(
    model: nn.Module, *, device: torch.device, dtype: torch.dtype | None, input_shape: Sequence[int],
    batches: Sequence[int], eval_batches: Sequence[int],
    loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
    autocast: Callable[[], AbstractContextManager[object]] = nullcontext, examples: Sequence[torch.Tensor] = (),
) -> Probe:  # fmt: skip
    """Probe `model` (a copy is measured) on a CUDA `device`: weights in `dtype` (None: as they are; DeepSpeed
    keeps 16-bit ones), `loss(model, inputs, labels)` the run's forward and loss. `examples`: draws of a few real
    inputs, each repeated to each batch, so that a forward that branches on its values takes the run's paths:
    every draw is measured and each batch keeps its largest bytes (default: one draw of zeros).
    Raises torch.OutOfMemoryError where even the probe does not fit."""
    start = time.perf_counter()
    twin: nn.Module | None = None
    try:
        with torch.random.fork_rng(devices=[device.index or 0], device_type="cuda"):
            twin = throwaway_copy(model, device, dtype)
            sources = [e.to(device) for e in examples] or [torch.zeros(1, *input_shape, device=device)]
            twin.train()
            train = [(b, max(_train_bytes(twin, b, device, s, loss, autocast) for s in sources)) for b in batches]
            twin.eval()
            evaluate = [(b, max(_eval_bytes(twin, b, device, s, loss, autocast) for s in sources))
                        for b in eval_batches]  # fmt: skip
    finally:
        del twin
        gc.collect()
        torch.cuda.empty_cache()  # the copy's blocks go back, so that the run's own reserve starts clean
    return Probe(fit(train), fit(evaluate), tuple(batches), time.perf_counter() - start)


Autocast = Callable[[], AbstractContextManager[object]]


def _train_bytes(twin: nn.Module, batch: int, device: torch.device, source: torch.Tensor,
                 loss: Callable[..., torch.Tensor], autocast: Autocast) -> int:  # fmt: skip
    """Activation bytes of a training step at `batch`: the pass's peak above what was there, less the
    parameter gradients it leaves (peak.py counts those itself). The second of two passes: the first
    loads kernels and lets cuDNN and cuBLAS take their workspaces."""
    for _ in range(2):
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        inputs, labels = _batch(batch, source)
        with autocast():
            value = loss(twin, inputs, labels)
        forward = torch.cuda.max_memory_allocated(device) - base
        value.backward()
        whole = torch.cuda.max_memory_allocated(device) - base
        grads = sum(p.grad.untyped_storage().nbytes() for p in twin.parameters() if p.grad is not None)
        del value, inputs, labels
        twin.zero_grad(set_to_none=True)
    # Where the peak falls before the gradients exist, the forward's peak is the activations' own.
    return max(forward, whole - grads)


def _eval_bytes(twin: nn.Module, batch: int, device: torch.device, source: torch.Tensor,
                loss: Callable[..., torch.Tensor], autocast: Autocast) -> int:  # fmt: skip
    """Bytes of an evaluation batch's forward pass without gradients (the second of two, as above)."""
    peak = 0
    for _ in range(2):
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        inputs, labels = _batch(batch, source)
        with torch.no_grad(), autocast():
            loss(twin, inputs, labels)
        peak = torch.cuda.max_memory_allocated(device) - base
        del inputs, labels
    return peak


def _batch(batch: int, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`batch` inputs cut from `source` repeated, and labels: made inside the measurement, as the run's loader
    hands each step a new batch tensor too."""
    repeats = -(-batch // len(source))
    inputs = source.repeat(repeats, *([1] * (source.dim() - 1)))[:batch].contiguous()
    return inputs, torch.zeros(batch, dtype=torch.long, device=source.device)
