"""`ema_decay`: evaluate, checkpoint and export an exponential moving average of the parameters.

After each optimizer step the average moves toward the parameters, `average += w * (param - average)` with
`w = 1 - min(ema_decay, (1 + n) / (10 + n))` after `n` updates, so that the initial weights stop counting
within the first steps (the warm-up of timm's ModelEmaV3). Every evaluation runs with the average standing in
for the parameters (`swapped`), so the metrics, the stop at `stop_at_accuracy`, results.json's accuracy and
the exported weights are the average's; training goes on from the parameters as trained. A run without
`ema_decay` holds a `WeightAverage` too, whose update and swap do nothing: the loop asks it alike.

What it costs: an fp32 copy of the trainable parameters on their device for the whole run, and during each
evaluation a copy of the parameters in their own dtype (`resident_bytes`: a part of every predicted peak, "the
average of the weights" of its breakdown, and of `accel-mnist estimate --ema-decay`). After each optimizer step
(outside a captured step's graph) an update of fp32 parameters is two kernels, whatever their number: the
average is one flat buffer per device, the parameters are concatenated into a temporary of their size (the
same bytes as the evaluation's copy, already in the bound) and one `lerp_` moves it; parameters in another
dtype are moved one `lerp_` each, through an fp32 copy of one tensor at a time.
The average needs whole parameters on every process: DeepSpeed ZeRO-3 and FSDP shard them, and the run
refuses it there (distributed/option_rules.py, `averaging_refusal`). Checkpoints hold the average through
Accelerate's `register_for_checkpointing` (a dict of tensors, which the restricted unpickler loads), so that
a resumed run continues it exactly. What it buys in steps: docs/measurements.md#trainingaveragingpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from accelerate import Accelerator
from torch import nn

from ..distributed.gather import unwrapped
from ..distributed.strategy import Strategy
from ..memory.model_states import average_bytes
from ..run.checkpoint_weights import average_in

WARMUP = 10  # the 10 of (1 + n) / (10 + n): the larger, the longer the decay stays below ema_decay


class WeightAverage:
    """The exponential moving average of `model`'s trainable parameters at `decay` (None: no average)."""

    def __init__(self, model: nn.Module, decay: float | None) -> None:
        self.decay = decay
        named = [(n, p) for n, p in model.named_parameters() if p.requires_grad] if decay is not None else []
        # Named as the model's state dict names them (the export's keys), so that a checkpoint's average can
        # be exported without building the model (export/model_dir.py).
        self.names = [name for name, _ in named]
        self.params = [param for _, param in named]
        self.flats, self.average = _flat_average(self.params)
        self.updates = 0

    @classmethod
    def start(cls, accelerator: Accelerator, decay: float | None, model: nn.Module) -> WeightAverage:
        """The run's average of the prepared `model`, saved and loaded with the checkpoints where there is one."""
        if decay is None:
            return cls(model, None)
        # The same tensors, named without the wrappers (and without importing deepspeed where none runs).
        average = cls(unwrapped(accelerator, model, Strategy.of(accelerator)), decay)
        accelerator.register_for_checkpointing(average)
        return average

    def update(self) -> None:
        """Move the average toward the parameters: after each optimizer step."""
        if self.decay is None:
            return
        self.updates += 1
        weight = 1.0 - min(self.decay, (1 + self.updates) / (WARMUP + self.updates))
        with torch.no_grad():
            for flat, indices in self.flats:
                params = [self.params[i].detach() for i in indices]
                if params[0].dtype == flat.dtype:
                    flat.lerp_(torch.cat([_in_memory_order(p).reshape(-1) for p in params]), weight)
                    continue
                for i, param in zip(indices, params, strict=True):
                    self.average[i].lerp_(param.to(flat.dtype), weight)

    @contextmanager
    def swapped(self) -> Iterator[None]:
        """The average in the parameters' place meanwhile (in their dtype), the parameters back afterwards."""
        if self.decay is None:
            yield
            return
        kept = [param.detach().clone() for param in self.params]
        with torch.no_grad():
            for average, param in zip(self.average, self.params, strict=True):
                param.copy_(average)
        try:
            yield
        finally:
            with torch.no_grad():
                for kept_param, param in zip(kept, self.params, strict=True):
                    param.copy_(kept_param)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint holds: the number of updates and the averaged tensors by parameter name."""
        return {"updates": self.updates, "average": dict(zip(self.names, self.average, strict=True))}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue the average a checkpoint holds; a ValueError where it is not this model's."""
        saved = average_in(state)
        if saved is None or {k: t.shape for k, t in saved.items()} != dict(zip(self.names, self.shapes(), strict=True)):
            raise ValueError("its averaged weights (ema_decay) do not fit this model's parameters")
        with torch.no_grad():
            for name, average in zip(self.names, self.average, strict=True):
                average.copy_(saved[name])
        self.updates = state["updates"]

    def shapes(self) -> list[torch.Size]:
        """The averaged tensors' shapes, in the parameters' order."""
        return [t.shape for t in self.average]


def _flat_average(params: list[nn.Parameter]) -> tuple[list[tuple[torch.Tensor, list[int]]], list[torch.Tensor]]:
    """fp32 copies of `params`: one flat buffer per device and dtype (with the indices of its parameters),
    and each parameter's copy as a view of its buffer, in the parameters' order."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for i, param in enumerate(params):
        groups.setdefault((param.device, param.dtype), []).append(i)
    flats, average = [], [torch.empty(0)] * len(params)
    for indices in groups.values():
        flat = torch.cat([_in_memory_order(params[i].detach()).reshape(-1).to(torch.float32) for i in indices])
        offset = 0
        for i in indices:
            ordered, order = _in_memory_order(params[i]), _memory_order(params[i])
            view = flat[offset : offset + ordered.numel()].view(ordered.shape)
            # Back in the parameter's dimension order: the same strides, so that a channels-last
            # weight's average is channels-last too and the copies between them are plain.
            average[i] = view.permute([order.index(d) for d in range(view.dim())])
            offset += ordered.numel()
        flats.append((flat, indices))
    return flats, average


def _memory_order(tensor: torch.Tensor) -> list[int]:
    """`tensor`'s dimensions from the outermost in memory to the innermost (a channels-last weight's
    0, 2, 3, 1), ties in their own order."""
    strides = tensor.stride()
    return sorted(range(tensor.dim()), key=lambda d: -strides[d])


def _in_memory_order(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` with its dimensions permuted to their memory order: a view, contiguous where `tensor` is
    dense (any parameter an optimizer steps), so that flattening it copies nothing."""
    return tensor.permute(_memory_order(tensor))


def resident_bytes(model: nn.Module, decay: float | None) -> int:
    """Device bytes the average holds besides the model states: its fp32 copy for the whole run, and the
    parameters' own copy while it stands in for them at an evaluation (counted throughout: a bound)."""
    if decay is None:
        return 0
    return sum(average_bytes([p.numel()], p.element_size()) for p in model.parameters() if p.requires_grad)
