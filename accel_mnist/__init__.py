"""accel_mnist: one Accelerate training loop for MNIST-class data on CPU, GPUs, DDP and DeepSpeed ZeRO.

Usage::

    from accel_mnist import TrainConfig, train
    results = train(TrainConfig(model="cnn", epochs=1))
"""

from .config import TrainConfig
from .errors import ConfigError, DataError, UsageError
from .export import load_model
from .loop import evaluate, train
from .models import MODELS, build_model

__all__ = [
    "TrainConfig", "train", "evaluate", "load_model", "build_model", "MODELS",
    "UsageError", "ConfigError", "DataError",
]  # fmt: skip
__version__ = "0.1.0"
