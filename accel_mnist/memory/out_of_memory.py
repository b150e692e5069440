"""The one line a run ends with when its accelerator runs out of memory.

It names where the run was, what the prediction said the peak would be, what the allocator
could use on this device (its total, times a per-process memory fraction where one is set) and
held when it failed, and what the estimate says would fit: the largest batch per process under
this strategy, and the strategies that fit at this batch. Nothing is written: the last
checkpoint, if any, stays as it was.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from accelerate import Accelerator

from ..errors import OutOfMemory
from .model_states import STRATEGIES, format_bytes
from .peak import fits, largest_batch, phases, predict_peak
from .watch import MemoryWatch


def capacity(device: torch.device) -> int | None:
    """Bytes the allocator may take on `device`: its memory times the process's fraction (1 unless set)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" names no index
    total = torch.cuda.get_device_properties(index).total_memory
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.6
    return int(total * (get_fraction(index) if callable(get_fraction) else 1.0))


def advice(watch: MemoryWatch, batch_size: int, room: int) -> str:
    """What the estimate says fits `room` bytes: a batch under this strategy, other strategies at this one."""
    if watch.setup is None or watch.peak is None:
        return "no prediction for this model (its forward pass did not run on the meta device)"
    numels, setup, inputs = watch.numels, watch.setup, watch.peak
    largest = largest_batch(numels, setup, inputs, room)
    here = f"batch {largest} per process fits under {setup.label}" if largest else f"no batch fits under {setup.label}"
    if not largest and not fits(phases(numels, setup, inputs.at_batch(1))["evaluate"], room):
        here += " (its evaluation batch is too large: lower --eval-batch-size)"
    others = [name for name, options in STRATEGIES.items()
              if fits(predict_peak(numels, replace(setup, **_options(options)), inputs), room)]  # fmt: skip
    there = f"at batch {batch_size}: {', '.join(others)}" if others else f"no strategy fits at batch {batch_size}"
    return f"{here}; {there}"


def _options(options: dict) -> dict:
    full = {"zero_stage": 0, "offload_optimizer": False, "offload_param": False}
    return {**full, **options}


def out_of_memory_error(
    accelerator: Accelerator, batch_size: int, watch: MemoryWatch | None, step: int | None,
    last_checkpoint: Path | None,
) -> OutOfMemory:  # fmt: skip
    """The OutOfMemory to raise for a torch.OutOfMemoryError, in one line."""
    device = accelerator.device
    room = capacity(device)
    where = ("before training (placing or preparing the model)" if step is None
             else f"after step {step}" if step else "in the first step")  # fmt: skip
    predicted = watch.predicted.get("peak_allocated_bytes") if watch is not None else None
    held = torch.cuda.max_memory_reserved(device) if device.type == "cuda" else None
    parts = [f"out of {device.type.upper()} memory {where} at batch {batch_size} per process",
             f"predicted peak {format_bytes(predicted)}" if predicted else "peak not predicted"]  # fmt: skip
    if room:
        parts.append(f"the allocator may use {format_bytes(room)} of this GPU and held {format_bytes(held)}")
    if watch is not None and room:
        parts.append(f"the estimate: {advice(watch, batch_size, room)}")
    kept = f"the last checkpoint {last_checkpoint} is kept" if last_checkpoint else "no checkpoint was written"
    return OutOfMemory("; ".join(parts) + f" ({kept}; `accel-mnist estimate --fits` tells more)")
