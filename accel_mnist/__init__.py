"""accel_mnist: one Accelerate training loop for MNIST-class data on CPU, GPUs, DDP and DeepSpeed ZeRO.

Usage::

    from accel_mnist import TrainConfig, train
    results = train(TrainConfig(model="cnn", epochs=1))
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .config import TrainConfig
    from .errors import ConfigError, DataError, UsageError
    from .evaluation import evaluate
    from .export.model_dir import load_model
    from .models import MODELS, build_model
    from .training.loop import train

# Imported on first use (PEP 562): `import accel_mnist.report` in the background plot process
# should not pay for torch and accelerate. (`accel-mnist --help` pays for torch, which the
# config's model and dataset registries import, but not for accelerate.)
_EXPORTS = {
    "TrainConfig": "config", "train": "training.loop", "evaluate": "evaluation", "load_model": "export.model_dir",
    "build_model": "models", "MODELS": "models",
    "UsageError": "errors", "ConfigError": "errors", "DataError": "errors",
}  # fmt: skip
__all__ = [
    "TrainConfig", "train", "evaluate", "load_model", "build_model", "MODELS",
    "UsageError", "ConfigError", "DataError",
]  # fmt: skip
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
