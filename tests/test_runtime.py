"""runtime.py builds the Accelerator without changing Accelerate itself."""

from __future__ import annotations

import inspect

import accelerate.accelerator
import accelerate.optimizer
import accelerate.utils
import pytest

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


def _fake_deepspeed_accelerator(mixed_precision: str, ds_config: dict):
    from types import SimpleNamespace

    plugin = SimpleNamespace(deepspeed_config=ds_config, gradient_accumulation_steps=1)
    return SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=plugin), num_processes=1,
                           mixed_precision=mixed_precision)  # fmt: skip


@pytest.mark.parametrize("mixed_precision, expected", [("fp16", "fp16"), ("bf16", "bf16"), ("no", None)])
def test_deepspeed_casts_buffers_with_the_parameters(mixed_precision, expected):
    # Without it DeepSpeed 0.19 leaves BatchNorm's running statistics in fp32 beside fp16
    # weights, and bncnn fails in its first forward under zero2.yaml on a GPU.
    from accel_mnist.runtime import _align_deepspeed

    ds: dict = {"zero_optimization": {"stage": 2}}
    _align_deepspeed(_fake_deepspeed_accelerator(mixed_precision, ds), TrainConfig(), 1)  # type: ignore[arg-type]
    assert ds.get("data_types", {}).get("buffer_dtype") == expected


def test_a_deepspeed_json_keeps_its_own_buffer_dtype():
    from accel_mnist.runtime import _align_deepspeed

    ds: dict = {"zero_optimization": {"stage": 2}, "data_types": {"buffer_dtype": "fp32"}}
    _align_deepspeed(_fake_deepspeed_accelerator("fp16", ds), TrainConfig(), 1)  # type: ignore[arg-type]
    assert ds["data_types"]["buffer_dtype"] == "fp32"
