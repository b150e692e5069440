"""Joining the process group again after the launcher restarted the workers.

`accelerate launch --max_restarts N` (torchrun) restarts every worker of a group when one dies.
The restarted workers reach the agent's TCPStore, which outlives the restart with the previous
attempt's keys still in it (torch 2.14's static rendezvous keeps one store; its worker side no
longer adds a per-attempt prefix). Gloo's connectFullMesh then reads a dead peer's address
whenever it asks before the new peer has written its own, and fails with "Connection refused"
(seen with a script that only calls init_process_group and all_reduce, whenever rank 0 started
first). Creating the default group here, on a store prefix of this attempt alone, makes every
key fresh; Accelerate and DeepSpeed then use the existing group. First attempts are left to
Accelerate, as before.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist


def restart_attempt() -> int:
    """How often torchrun has restarted this worker group (0: the first start, or no torchrun)."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    except ValueError:
        return 0


def join_restarted_group(timeout: timedelta = timedelta(minutes=10)) -> bool:
    """On a restart by torchrun, create the default process group on a fresh key prefix.

    Returns whether it did. Costs one TCPStore client connection more than Accelerate's own
    init, and the group uses this timeout rather than an InitProcessGroupKwargs one.
    """
    attempt = restart_attempt()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if attempt == 0 or world_size < 2 or not dist.is_available() or dist.is_initialized():
        return False
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return False  # rank 0 hosts a new store of its own: nothing stale in it
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False, timeout=timeout
    )
    backend = "cuda:nccl,cpu:gloo" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(
        backend,
        store=dist.PrefixStore(f"accel_mnist/attempt_{attempt}", store),
        rank=int(os.environ["RANK"]),
        world_size=world_size,
        timeout=timeout,
    )
    return True
