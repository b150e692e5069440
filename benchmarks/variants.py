"""Model variants for the fewer-steps measurements (issue 45's item 2), given as `--set model=...`:

    python -m benchmarks.repeat --config recipes/fast99_graph.yaml --seeds 0-19 \
        --set model=benchmarks.variants:bncnn_16

Each is a factory that `accel_mnist.models.model_from_path` calls, so the runs go through the project's own
loop, captured step and evaluation unchanged; only the model differs.

- `bncnn_16`, `bncnn_24`, `bncnn_48`: the registry's BNCNN with its three widths scaled (16-32-64, 24-48-96,
  48-96-192 channels against 32-64-128): what a narrower or wider step buys or costs in steps to 99%.
- `bncnn_average_090`, `bncnn_average_095`, `bncnn_average_098`: the registry's BNCNN evaluated with an
  exponential moving average of its parameters (decay 0.90, 0.95, 0.98; BatchNorm's running statistics are
  its own). A measuring device, not a feature: the average is taken in the training forward, so it holds the
  parameters up to the step before the last one (one step behind), and it is not saved in checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from accel_mnist.models import BNCNN


class AveragedForEvaluation(nn.Module):
    """`model` trained as it is, evaluated with an exponential moving average of its parameters.

    The average is updated at the start of each training forward (`lerp_` per parameter, inside a captured
    step as well), with a decay of `min(decay, (1 + n) / (10 + n))` after `n` updates, so the first steps do
    not weigh the initialisation for long. The evaluation forward calls the model with the averaged
    parameters in place of its own (`torch.func.functional_call`); the buffers are the model's.
    """

    def __init__(self, model: nn.Module, decay: float) -> None:
        super().__init__()
        self.model, self.decay = model, decay
        self.names = [name for name, _ in model.named_parameters()]
        for i, param in enumerate(model.parameters()):
            self.register_buffer(f"average_{i}", param.detach().clone())
        self.register_buffer("updates", torch.zeros((), dtype=torch.float32))

    def averages(self) -> list[torch.Tensor]:
        """The averaged parameters, in the model's parameter order."""
        return [getattr(self, f"average_{i}") for i in range(len(self.names))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's logits: its own parameters in training, the averaged ones in evaluation."""
        if not self.training:
            return functional_call(self.model, dict(zip(self.names, self.averages(), strict=True)), (x,))
        with torch.no_grad():
            self.updates.add_(1)
            # Tensors only (no .item()), so that a captured step replays the update with the right weight.
            weight = 1 - torch.clamp((1 + self.updates) / (10 + self.updates), max=self.decay)
            for average, param in zip(self.averages(), self.model.parameters(), strict=True):
                average.lerp_(param.detach().to(average.dtype), weight)
        return self.model(x)


def bncnn_16() -> nn.Module:
    """BNCNN at half the widths: 16, 32, 64 channels."""
    return BNCNN((16, 32, 64))


def bncnn_24() -> nn.Module:
    """BNCNN at three quarters of the widths: 24, 48, 96 channels."""
    return BNCNN((24, 48, 96))


def bncnn_48() -> nn.Module:
    """BNCNN at one and a half times the widths: 48, 96, 192 channels."""
    return BNCNN((48, 96, 192))


def bncnn_average_090() -> nn.Module:
    """BNCNN evaluated with a moving average of its parameters, decay 0.90."""
    return AveragedForEvaluation(BNCNN(), 0.90)


def bncnn_average_095() -> nn.Module:
    """BNCNN evaluated with a moving average of its parameters, decay 0.95."""
    return AveragedForEvaluation(BNCNN(), 0.95)


def bncnn_average_098() -> nn.Module:
    """BNCNN evaluated with a moving average of its parameters, decay 0.98."""
    return AveragedForEvaluation(BNCNN(), 0.98)
