"""runtime.py builds the Accelerator without changing Accelerate itself."""

from __future__ import annotations

import inspect

import accelerate.accelerator
import accelerate.optimizer
import accelerate.utils

from accel_mnist import TrainConfig
from accel_mnist.runtime import build_accelerator


def test_build_accelerator_leaves_accelerates_modules_as_they_are(tmp_path):
    before = {
        "optimizer.inspect": accelerate.optimizer.inspect,
        "optimizer.is_lomo_available": accelerate.optimizer.is_lomo_available,
        "accelerator.is_lomo_available": accelerate.accelerator.is_lomo_available,
    }
    accelerator = build_accelerator(TrainConfig(output_dir=str(tmp_path)))
    try:
        assert accelerate.optimizer.inspect is inspect
        assert accelerate.optimizer.is_lomo_available is accelerate.utils.is_lomo_available
        assert not hasattr(accelerate.optimizer.is_lomo_available, "cache_info")
        after = {
            "optimizer.inspect": accelerate.optimizer.inspect,
            "optimizer.is_lomo_available": accelerate.optimizer.is_lomo_available,
            "accelerator.is_lomo_available": accelerate.accelerator.is_lomo_available,
        }
        assert after == before
    finally:
        accelerator.free_memory()
