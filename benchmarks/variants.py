"""Model variants for the fewer-steps measurements (issue 45's item 2), given to benchmarks/repeat.py:

    python -m benchmarks.repeat --config recipes/fast99_graph.yaml --seeds 0-19 \
        --model benchmarks.variants:bncnn_16

Each is a factory that `accel_mnist.models.model_from_path` calls, so the runs go through the project's own
loop, captured step and evaluation unchanged; only the model differs.

- `bncnn_16`, `bncnn_24`, `bncnn_48`: the registry's BNCNN with its three widths scaled (16-32-64, 24-48-96,
  48-96-192 channels against 32-64-128): what a narrower or wider step buys or costs in steps to 99%.
- `bncnn_pool_first`: the registry's `bncnn_pool` (each block pools before its BatchNorm and ReLU), kept
  under the name the commands of its first measurements give (cpu-2026-12-07-fewer-steps,
  h100-2026-12-07-pool/call1); benchmarks/suites.py's rows now name the registry's model.

An average of the weights for evaluation is the run's own option, `--set ema_decay=0.95`
(training/averaging.py), and takes any of these models.
"""

from __future__ import annotations

from torch import nn

from accel_mnist.models import BNCNN


def bncnn_16() -> nn.Module:
    """BNCNN at half the widths: 16, 32, 64 channels."""
    return BNCNN((16, 32, 64))


def bncnn_24() -> nn.Module:
    """BNCNN at three quarters of the widths: 24, 48, 96 channels."""
    return BNCNN((24, 48, 96))


def bncnn_48() -> nn.Module:
    """BNCNN at one and a half times the widths: 48, 96, 192 channels."""
    return BNCNN((48, 96, 192))


def bncnn_pool_first() -> nn.Module:
    """BNCNN with each block's max-pool before its BatchNorm and ReLU: the registry's `bncnn_pool`, under
    the name its first measurements' commands give it."""
    return BNCNN(pool_first=True)
