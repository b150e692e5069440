"""The training step, as Accelerate's examples write it: accumulate, loss, backward, clip, optimizer
step, zero the gradients, in `EagerStep.__call__`.

`StepCalls` (distributed/lean_steps.py) answers the Accelerator's calls there, and `prepare` hands the
optimizer back as `DirectStep` where Accelerate's wrapper would only add per-step work; both keep the
Accelerator's interface, so the step reads the same under every strategy. The step captured as a CUDA
graph records this same call once and replays it: training/captured_step.py.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn

from ..config import TrainConfig
from ..distributed.lean_steps import StepCalls
from ..distributed.option_rules import channels_last_change
from ..distributed.strategy import Strategy
from ..model_output import logits_of


def to_memory_format(model: nn.Module, config: TrainConfig, strategy: Strategy | None = None) -> nn.Module:
    """The model in channels-last where `config.channels_last` asks (4-D weights only; others as they are),
    unless `strategy` keeps parameters contiguous (option_rules.channels_last_change)."""
    if not config.channels_last or (strategy is not None and channels_last_change(strategy)):
        return model
    return model.to(memory_format=torch.channels_last)


def step_input(inputs: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """A batch in the layout the step computes in (channels-last images where the config asks)."""
    if channels_last and inputs.ndim == 4:
        return inputs.contiguous(memory_format=torch.channels_last)
    return inputs


def batch_loss(
    model: nn.Module, inputs: torch.Tensor, labels: torch.Tensor, channels_last: bool, dtype: torch.dtype,
    label_smoothing: float = 0.0,
) -> torch.Tensor:  # fmt: skip
    """The forward pass and the training loss, as every step computes them (prewarm's copy and the memory
    probe included, so that they load and hold what the step does)."""
    inputs = step_input(inputs, channels_last)
    # Each conversion only where it converts: a no-op .to()/.float() still costs a dispatch a step.
    logits = logits_of(model(inputs if inputs.dtype == dtype else inputs.to(dtype)))
    logits = logits if logits.dtype == torch.float32 else logits.float()
    return F.cross_entropy(logits, labels, label_smoothing=label_smoothing)


class EagerStep:
    """Forward, backward and (at the end of an accumulation) the optimizer step of one micro-batch."""

    captured = False

    def __init__(self, accelerator: Accelerator, config: TrainConfig, model: nn.Module, optimizer: Any) -> None:
        self.accelerator, self.model, self.optimizer = accelerator, model, optimizer
        # What results.json says of the step: which one ran, the capture's seconds, why not captured.
        self.facts: dict[str, Any] = {"step": "eager", "capture_seconds": 0.0}
        self.max_grad_norm = config.max_grad_norm
        self.channels_last, self.label_smoothing = config.channels_last, config.label_smoothing
        self.calls = StepCalls(accelerator)  # the Accelerator's calls, without the per-step work that decides nothing
        # Under DeepSpeed fp16/bf16 the weights themselves are half precision and want inputs to
        # match; elsewhere they stay fp32 and autocast (if any) does the casting.
        self.input_dtype = next(model.parameters()).dtype

    def loss(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The forward pass and the loss, as every step computes them."""
        return batch_loss(self.model, inputs, labels, self.channels_last, self.input_dtype, self.label_smoothing)

    def with_optimizer(self, optimizer: Any) -> EagerStep:
        """This step with another optimizer (the captured step records it with the torch optimizer itself)."""
        twin = copy.copy(self)
        twin.optimizer = optimizer
        return twin

    def __call__(self, inputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """One micro-batch: its loss, with the optimizer stepped and the gradients zeroed where it ends
        an accumulation (the optimizer and `accumulate` decide that, as in Accelerate's examples)."""
        calls, optimizer = self.calls, self.optimizer
        with calls.accumulate(self.model):
            loss = self.loss(inputs, labels)
            calls.backward(loss)
            if self.max_grad_norm is not None and calls.sync_gradients:
                calls.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
        return loss
