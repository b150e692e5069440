"""The CUDA caching allocator's settings: expandable segments unless the user chose otherwise.

Without them the allocator keeps fixed-size segments, and at large batches the bytes it holds but
cannot hand out grow, well beyond what they are with `expandable_segments:True` (measured:
docs/measurements.md#memoryallocatorpy). A batch the prediction says fits then runs out on
fragmentation alone. torchtitan trains with the same setting. It must be in the environment before
CUDA starts in the process; a value the user set (either of torch's two variable names) is left as
it is.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import torch

VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch >= 2.9 reads the first before the second
EXPANDABLE = "expandable_segments:True"


def expandable_segments(env: MutableMapping[str, str] | None = None) -> bool:
    """Whether the allocator's settings in `env` (default: this process's) expand segments."""
    env = os.environ if env is None else env
    settings = ",".join(env.get(name, "") for name in VARIABLES)
    return any(item.replace(" ", "").lower() == EXPANDABLE.lower() for item in settings.split(","))


def run_expands_segments(env: MutableMapping[str, str] | None = None) -> bool:
    """Whether a run started from this process expands segments: the user asked for it in `env`, or
    default_settings will (neither variable set, CUDA not started yet)."""
    env = os.environ if env is None else env
    unset = not any(env.get(name) for name in VARIABLES)
    return expandable_segments(env) or (unset and not torch.cuda.is_initialized())


def default_settings(env: MutableMapping[str, str] | None = None) -> None:
    """Ask for expandable segments where neither variable is set and CUDA has not started in this process
    (once it has, the allocator has read its settings and the run keeps torch's defaults)."""
    env = os.environ if env is None else env
    if not any(env.get(name) for name in VARIABLES) and not torch.cuda.is_initialized():
        env["PYTORCH_CUDA_ALLOC_CONF"] = EXPANDABLE  # the older name: torch before 2.9 reads only this one


def settings(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """The allocator's variables as this process has them (results.json's `allocator_settings`)."""
    env = os.environ if env is None else env
    return {name: env[name] for name in VARIABLES if env.get(name)}


def capacity(device: torch.device) -> int | None:
    """Bytes this process's allocator may take on `device`: the card's memory times the process's memory
    fraction (1 unless set); None off CUDA. The one rule for this process's memory (probe.available,
    the out-of-memory line)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()  # "cuda" names no index
    total = torch.cuda.get_device_properties(index).total_memory
    get_fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)  # torch >= 2.6
    return int(total * (get_fraction(index) if callable(get_fraction) else 1.0))
