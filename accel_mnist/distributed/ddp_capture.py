"""What capturing the step as a CUDA graph under DDP asks of `prepare`: the wrapper built on a side stream.

`captures_under_ddp` is the one rule that `prepare` (the side stream) and the captured step
(training/captured_step.py: its longer warm-up) both read, so that they cannot disagree.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from ..config import TrainConfig


def captures_under_ddp(accelerator: Accelerator, config: TrainConfig) -> bool:
    """Whether this run will try to capture its step as a CUDA graph under DDP (NCCL on CUDA)."""
    return (
        bool(config.cuda_graph)
        and accelerator.distributed_type == DistributedType.MULTI_GPU
        and accelerator.device.type == "cuda"
    )


@contextlib.contextmanager
def ddp_side_stream(accelerator: Accelerator, config: TrainConfig) -> Iterator[None]:
    """A side stream to build the DDP wrapper on, where the step will be captured under DDP;
    elsewhere nothing.

    DDP's reducer takes each parameter's AccumulateGrad node when it is built, and autograd runs
    those nodes on the stream that was current then: built on the default stream, a captured
    backward would reach back to it, which a capture cannot record (torch.cuda.graphs docs,
    "Usage with DistributedDataParallel": construct DDP in a side-stream context).
    """
    if not captures_under_ddp(accelerator, config):
        yield
        return
    device = accelerator.device
    side = torch.cuda.Stream(device=device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        yield
    torch.cuda.current_stream(device).wait_stream(side)  # the weights it moved and broadcast
