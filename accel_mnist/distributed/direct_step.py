"""Direct per-step calls where Accelerate's would only add per-step work that decides nothing.

The optimizer: accelerate 1.15's `AcceleratedOptimizer.step` asks `is_lomo_available()` twice (a
module search over sys.path) and `zero_grad` calls `inspect.signature` on every step, a large share
of a small model's CPU step (measured: docs/measurements.md#distributeddirect_steppy). Where those
calls decide nothing (no grad scaler, no XLA, DeepSpeed or FSDP, an optimizer that is not LOMO), the
loop steps the wrapped torch optimizer itself, through public attributes only (`.optimizer`,
`.scaler`, `accelerator.sync_gradients`); everything else still goes through Accelerate.

Accumulation and backward (`MicroStep`): with one micro-batch per optimizer step,
`accelerator.accumulate` only sets `sync_gradients` to the True it already is (and counts
micro-batches in `accelerator.step`, which then stays 0: with one micro-batch per step that
count decides nothing), and `accelerator.backward` divides the loss by 1: one more tensor op
and one more autograd node per step (a kernel launch each way on a GPU), for the same
gradients bit for bit.

`captures_under_ddp`: whether a run captures its step under DDP, which `prepare` (the side
stream DDP is built on, `ddp_side_stream`) and the captured step (its warm-up) must agree on.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType

from ..config import TrainConfig
from .strategy import REPLICATED


def torch_optimizer(optimizer: Any) -> torch.optim.Optimizer | None:
    """The innermost torch optimizer behind Accelerate's, DeepSpeed's and this module's wrappers."""
    found = None
    for _ in range(4):
        if isinstance(optimizer, torch.optim.Optimizer):
            found = optimizer
        optimizer = getattr(optimizer, "optimizer", None)
        if optimizer is None:
            break
    return found


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


class DirectStep:
    """The prepared optimizer, with `step` and `zero_grad` as Accelerate would do them here."""

    # Accelerate marks a step skipped only where its grad scaler skipped it, and there is none
    # here; a plain attribute spares the loop a __getattr__ fallback every step.
    step_was_skipped = False

    def __init__(self, prepared: Any, accelerator: Accelerator) -> None:
        self._prepared, self._inner, self._accelerator = prepared, prepared.optimizer, accelerator
        self._set_to_none = "set_to_none" in inspect.signature(self._inner.zero_grad).parameters

    def step(self, closure: Any = None) -> None:
        """Step the torch optimizer at an accumulation boundary, as AcceleratedOptimizer does."""
        if self._accelerator.sync_gradients:
            self._inner.step(closure)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Zero the gradients at an accumulation boundary (set to None, Accelerate's default)."""
        if not self._set_to_none or set_to_none is not None:
            self._prepared.zero_grad(set_to_none)
        elif self._accelerator.sync_gradients:
            self._inner.zero_grad(set_to_none=True)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._prepared, name)


def direct_steps(accelerator: Accelerator, prepared: Any) -> Any:
    """`DirectStep(prepared)` where that changes nothing but the cost, else `prepared` itself."""
    inner = getattr(prepared, "optimizer", None)
    plain = (
        accelerator.distributed_type in REPLICATED
        and getattr(prepared, "scaler", True) is None
        and type(inner).__module__.startswith("torch.optim")
    )
    return DirectStep(prepared, accelerator) if plain else prepared


class MicroStep:
    """`accumulate()` and `backward(loss)` for one micro-batch: Accelerate's, or the plain calls
    they come down to with one micro-batch per step (no XLA, DeepSpeed, FSDP or grad scaler)."""

    _NOTHING = contextlib.nullcontext()

    def __init__(self, accelerator: Accelerator, model: torch.nn.Module) -> None:
        self._accelerator, self._model = accelerator, model
        self._direct = accelerator.distributed_type in REPLICATED and accelerator.gradient_accumulation_steps == 1
        self._direct_backward = self._direct and accelerator.scaler is None

    def accumulate(self) -> contextlib.AbstractContextManager[Any]:
        """`accelerator.accumulate(model)`, or nothing where it would only keep sync_gradients True."""
        # sync_gradients lives in Accelerate's GradientState singleton: an earlier run in this
        # process may have left it False, and then only Accelerate's own call sets it right.
        if self._direct and self._accelerator.sync_gradients:
            return self._NOTHING
        return self._accelerator.accumulate(self._model)

    def backward(self, loss: torch.Tensor) -> None:
        """`accelerator.backward(loss)`, or `loss.backward()` where that would divide by 1."""
        if self._direct_backward:
            loss.backward()
        else:
            self._accelerator.backward(loss)


def allocate_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Give a fresh optimizer its per-parameter state slots, leaving the parameters unchanged.

    Accelerate loads an FSDP1 SHARDED_STATE_DICT optimizer checkpoint into the slots that
    `FSDP.optim_state_dict(model, optimizer)` has at that moment; a fresh Adam has none, so the
    moments and step counts would be silently dropped and the resumed run would drift from the
    uninterrupted one (measured: docs/measurements.md#distributeddirect_steppy). torch's own
    get_optimizer_state_dict (the FSDP2 path) allocates them the same way first: one step with zero
    gradients at lr 0. The checkpoint then overwrites every slot; the cost is one optimizer step per
    resume.
    """
    if optimizer.state:
        return
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = torch.zeros_like(group["lr"]) if isinstance(group["lr"], torch.Tensor) else 0.0
        for p in group["params"]:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    for group, lr in zip(optimizer.param_groups, lrs, strict=True):
        group["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
