"""Decisions every rank takes together, so that no rank stops while the others wait.

A check that raises on one node while the other enters a collective leaves that node hanging
(or ending with exit 1 and no message). These helpers exchange small integer tensors through
Accelerate's gather, never pickled objects: an error message travels as its UTF-8 bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast

from ..errors import UsageError, error_for, on_every_rank

T = TypeVar("T")
_MESSAGE_BYTES = 1024


def single_node(accelerator: Accelerator) -> bool:
    """Whether all processes run on this machine (then every path is the same for all)."""
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    return accelerator.num_processes == 1 or (local.isdigit() and int(local) == accelerator.num_processes)


def gather_ints(accelerator: Accelerator, values: list[int]) -> list[list[int]]:
    """`values` of every rank, indexed by rank (the same list on all ranks)."""
    mine = torch.tensor([values], dtype=torch.int64, device=accelerator.device)
    return accelerator.gather(mine).reshape(accelerator.num_processes, len(values)).tolist()


def agree(accelerator: Accelerator, check: Callable[[], T]) -> T:
    """Run `check` on every rank; if it raised UsageError anywhere, raise the lowest such rank's
    error on all ranks (with its exit code, marked as raised by every rank), so that every node
    stops with the same `error:` line."""
    error: UsageError | None = None
    result: T | None = None
    try:
        result = check()
    except UsageError as e:
        error = e
    if accelerator.num_processes == 1:
        if error is not None:
            raise on_every_rank(error)
        return result  # type: ignore[return-value]
    text = str(error).encode()[:_MESSAGE_BYTES] if error is not None else b""
    exit_code = error.exit_code if error is not None else 0
    # Length and exit code first, then the bytes, padded: gather needs one shape everywhere.
    codes = [len(text) + (error is not None), exit_code] + list(text) + [0] * (_MESSAGE_BYTES - len(text))
    for rank, row in enumerate(gather_ints(accelerator, codes)):
        if row[0]:
            if error is not None and rank == accelerator.process_index:
                raise on_every_rank(error)
            message = bytes(row[2 : row[0] + 1]).decode(errors="replace")
            raise on_every_rank(error_for(message, row[1])) from None
    return result  # type: ignore[return-value]


def seen_by_every_node(accelerator: Accelerator, directory: Path) -> bool:
    """Whether a file that rank 0 writes into `directory` is seen by every node (shared storage).

    Collective. A probe with a name drawn by rank 0 is written, looked for by each node's local
    main process, and removed; on one machine the answer is yes without looking.
    """
    if single_node(accelerator):
        return True
    nonce = torch.zeros(1, dtype=torch.int64, device=accelerator.device)
    if accelerator.is_main_process:
        nonce[0] = int.from_bytes(os.urandom(7), "big")
    probe = directory / f".accel_mnist_probe_{int(broadcast(nonce, from_process=0).item()):x}"
    wrote = True
    if accelerator.is_main_process:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            probe.write_text("")
        except OSError:
            wrote = False
    accelerator.wait_for_everyone()
    seen = wrote and (probe.exists() if accelerator.is_local_main_process else True)
    votes = gather_ints(accelerator, [int(seen)])
    if accelerator.is_main_process:
        probe.unlink(missing_ok=True)
    return all(v[0] for v in votes)
