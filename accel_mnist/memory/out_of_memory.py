"""The one line a run ends with when its accelerator runs out of memory.

It names where the run was, the predicted peak, what the allocator could use on this device (its
total, times a per-process memory fraction where one is set) and held, and what the estimate says
would fit: the largest batch per process under this strategy, below the batch that failed, and the
other strategies at this batch; scaled by how much more than predicted the run needed (torch's
message tells at least that), with the allocator's fragmentation where large. Nothing is written:
the last checkpoint, if any, stays as it was.
"""

from __future__ import annotations

import os
import re
from collections.abc import MutableMapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from ..errors import OutOfMemory
from .allocator import EXPANDABLE, capacity, expandable_segments
from .memory_watch import MemoryWatch
from .model_states import STRATEGIES, format_bytes
from .peak import FIT_SHARE, fits, largest_batch, why_nothing_fits

# torch's sizes in its out-of-memory message (c10's format_size: "512 bytes", "20.00 MiB", "2.00 GiB").
_SIZE = r"([\d.]+) (bytes|KiB|MiB|GiB)"
_UNITS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def message_bytes(message: str, pattern: str) -> int | None:
    """The size that `pattern` ("Tried to allocate {size}") finds in torch's message, in bytes; None if absent."""
    found = re.search(re.escape(pattern).replace(re.escape("{size}"), _SIZE), message)
    return int(float(found[1]) * _UNITS[found[2]]) if found else None


def requested_bytes(message: str) -> int | None:
    """What the failing allocation asked for ("Tried to allocate 2.00 GiB"); None where the message does not say."""
    tried = message_bytes(message, "Tried to allocate {size}")
    return tried if tried is not None else message_bytes(message, "Requested size: {size}")  # a fraction's refusal


def needed_at_least(peak_allocated: int, message: str) -> int:
    """A lower bound of the bytes the run needed: what was allocated as it failed (torch's message says; else
    the allocator's peak) plus what the failing allocation asked for."""
    asked = requested_bytes(message) or 0
    # The peak stands in only where the message does not say: it may be an earlier moment's (the forward
    # pass's end before a backward allocation failed) or another run's in this process (a sweep, a probe).
    at_failure = message_bytes(message, "Of the allocated memory {size} is allocated")
    return (peak_allocated if at_failure is None else at_failure) + asked


def fragmentation(gap: int, room: int, asked: int | None, env: MutableMapping[str, str]) -> str | None:
    """What to say of `gap` bytes held but not allocated, where it is a lot: more than the estimate's share
    for it (1 - FIT_SHARE of `room`) or enough for the failing request had it been one block."""
    if gap <= (1 - FIT_SHARE) * room and (not asked or gap < asked):
        return None
    said = f"{format_bytes(gap)} held but not allocated (fragmentation)"
    if expandable_segments(env):
        return f"{said}, even with expandable segments"
    return f"{said}: try PYTORCH_CUDA_ALLOC_CONF={EXPANDABLE}"


def need_rate(predicted: int | None, needed: int) -> float:
    """The factor by which the run needed more than predicted: 1 where it did not (or nothing was predicted)."""
    return needed / predicted if predicted and needed > predicted else 1.0


def advice(watch: Any, batch_size: int, room: int, rate: float = 1.0) -> str:
    """What the estimate, its peaks times `rate`, says fits `room` bytes: a batch under this strategy below the
    one that failed (`batch_size`), other strategies at it. `watch`: a MemoryWatch (its .numels, .setup, .peak)."""
    numels, setup, inputs = watch.numels, watch.setup, watch.peak
    usable = int(room / rate)  # a peak times `rate` fits `room` just where the peak fits this
    largest = largest_batch(numels, setup, inputs, usable)
    # The batch that failed does not fit, whatever the estimate says.
    capped, below = largest >= batch_size, min(largest, batch_size - 1)
    fit = "at most" if capped else "would fit" if rate > 1 else "fits"
    here = f"batch {below} per process {fit} under {setup.label}" if below else f"no batch fits under {setup.label}"
    here += f" (the estimate said {largest}, but {batch_size} failed)" if capped else ""
    if not largest:  # what takes the room, and the change that would free it
        here += f" ({why_nothing_fits(numels, setup, inputs, usable)})"
    others = [name for name, options in STRATEGIES.items()
              if (other := replace(setup, **_options(options))) != setup  # this one just failed at this batch
              and fits(numels, other, inputs, usable)]  # fmt: skip
    there = f"at batch {batch_size}: {', '.join(others)}" if others else f"no other strategy fits at batch {batch_size}"
    return f"{here}; {there}"


def unpredicted(watch: MemoryWatch | None) -> str:
    """Why the peak has no prediction, in a few words."""
    if watch is None:
        return "peak not predicted yet"
    why = watch.predicted.get("peak_unpredicted")  # the reason the prediction recorded, where it did
    return f"peak not predicted ({why or 'its forward pass did not run on the meta device'})"


def _options(options: dict) -> dict:
    full = {"zero_stage": 0, "offload_optimizer": False, "offload_param": False}
    return {**full, **options}


def gpu_parts(
    watch: Any, batch_size: int, room: int, held: int, peak: int, message: str, env: MutableMapping[str, str],
) -> list[str]:  # fmt: skip
    """The line's parts on a GPU: what the allocator may use (`room`) and `held`, how much more than predicted
    the run needed (at least its allocator's `peak` and what torch's `message` says it asked for), the
    allocator's fragmentation where large, and the estimate at that rate. `watch`: a MemoryWatch or None."""
    parts = [f"the allocator may use {format_bytes(room)} of this GPU and held {format_bytes(held)}"]
    predicted = watch.predicted.get("peak_allocated_bytes") if watch is not None else None
    needed = needed_at_least(peak, message)
    rate = need_rate(predicted, needed)
    if rate > 1:
        parts.append(f"the run needed at least {format_bytes(needed)}, {max(round(100 * (rate - 1)), 1)}% above "
                     f"the predicted {format_bytes(predicted)}")  # fmt: skip
    gap = message_bytes(message, "{size} is reserved by PyTorch but unallocated")  # as it failed; else the peaks'
    said = fragmentation(held - peak if gap is None else gap, room, requested_bytes(message), env)
    parts += [said] if said else []
    if predicted and batch_size >= 1 and watch.setup is not None and watch.peak is not None:  # 0: auto, unsettled
        parts.append(("at that rate " if rate > 1 else "the estimate: ") + advice(watch, batch_size, room, rate))
    return parts


def out_of_memory_error(
    accelerator: Accelerator, batch_size: int, watch: MemoryWatch | None, step: int | None,
    last_checkpoint: Path | None, error: BaseException | None = None,
) -> OutOfMemory:  # fmt: skip
    """The OutOfMemory to raise for a torch.OutOfMemoryError (`error`, whose message tells what it asked for)."""
    device = accelerator.device
    room = capacity(device)
    where = ("before training (placing or preparing the model)" if step is None
             else f"after step {step}" if step else "in the first step")  # fmt: skip
    predicted = watch.predicted.get("peak_allocated_bytes") if watch is not None else None
    parts = [f"out of {device.type.upper()} memory {where} at batch {batch_size} per process",
             f"predicted peak {format_bytes(predicted)}" if predicted else unpredicted(watch)]  # fmt: skip
    if room:
        held, peak = torch.cuda.max_memory_reserved(device), torch.cuda.max_memory_allocated(device)
        parts += gpu_parts(watch, batch_size, room, held, peak, str(error or ""), os.environ)
    kept = f"the last checkpoint {last_checkpoint} is kept" if last_checkpoint else "no checkpoint was written"
    return OutOfMemory("; ".join(parts) + f" ({kept}; `accel-mnist estimate --fits` tells more)")
