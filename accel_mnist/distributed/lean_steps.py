"""Accelerate's per-step calls, or the plain calls they come down to where Accelerate's would only add
work that decides nothing: the step (training/step.py) reads as Accelerate's examples do, through the
same interface either way.

The optimizer (`DirectStep`, handed back by `prepare` in place of Accelerate's): accelerate 1.15's
`AcceleratedOptimizer.step` asks `is_lomo_available()` twice (a module search over sys.path) and
`zero_grad` calls `inspect.signature` on every step, a large share of a small model's CPU step
(measured: docs/measurements.md#distributedlean_stepspy). Where those calls decide nothing (no grad
scaler, no XLA, DeepSpeed or FSDP, an optimizer that is not LOMO), the loop steps the wrapped torch
optimizer itself, through public attributes only (`.optimizer`, `.scaler`,
`accelerator.sync_gradients`); everything else still goes through Accelerate.

Accumulation and backward (`StepCalls`, what `step_calls` hands the step): with one micro-batch per
optimizer step, `accelerator.accumulate` only sets `sync_gradients` to the True it already is (and
counts micro-batches in `accelerator.step`, which then stays 0: with one micro-batch per step that
count decides nothing), and `accelerator.backward` divides the loss by 1: one more tensor op and one
more autograd node per step (a kernel launch each way on a GPU), for the same gradients bit for bit.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch
from accelerate import Accelerator

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


class StepCalls:
    """`accumulate(model)`, `backward(loss)`, `clip_grad_norm_` and `sync_gradients` as the Accelerator
    has them, with the first two the plain calls they come down to with one micro-batch per step (no
    XLA, DeepSpeed, FSDP or grad scaler)."""

    _NOTHING = contextlib.nullcontext()

    def __init__(self, accelerator: Accelerator) -> None:
        self._accelerator = accelerator
        self._direct = accelerator.distributed_type in REPLICATED and accelerator.gradient_accumulation_steps == 1
        self._direct_backward = self._direct and accelerator.scaler is None

    @property
    def sync_gradients(self) -> bool:
        """Whether this micro-batch ends an accumulation (Accelerate's flag)."""
        return self._accelerator.sync_gradients

    def accumulate(self, model: torch.nn.Module) -> contextlib.AbstractContextManager[Any]:
        """`accelerator.accumulate(model)`, or nothing where it would only keep sync_gradients True."""
        # sync_gradients lives in Accelerate's GradientState singleton: an earlier run in this
        # process may have left it False, and then only Accelerate's own call sets it right.
        if self._direct and self._accelerator.sync_gradients:
            return self._NOTHING
        return self._accelerator.accumulate(model)

    def backward(self, loss: torch.Tensor) -> None:
        """`accelerator.backward(loss)`, or `loss.backward()` where that would divide by 1."""
        if self._direct_backward:
            loss.backward()
        else:
            self._accelerator.backward(loss)

    def clip_grad_norm_(self, parameters: Any, max_norm: float) -> Any:
        """`accelerator.clip_grad_norm_`: the strategy decides how a sharded norm is taken."""
        return self._accelerator.clip_grad_norm_(parameters, max_norm)
