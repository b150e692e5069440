"""The throwaway engine's config: the run's, for one micro-batch, writing nothing of its own."""

from __future__ import annotations

from accel_mnist.distributed.engine_prewarm import scratch_config


def test_scratch_config_steps_once_per_micro_batch_and_writes_nothing():
    run = {"train_micro_batch_size_per_gpu": 64, "train_batch_size": 512, "gradient_accumulation_steps": 4,
           "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "cpu"}}, "fp16": {"enabled": True},
           "tensorboard": {"enabled": True, "output_path": "tb"}, "csv_monitor": {"enabled": True},
           "flops_profiler": {"enabled": True}, "checkpoint": {"load_universal": True}}  # fmt: skip
    found = scratch_config(run, world_size=2)
    assert found["gradient_accumulation_steps"] == 1 and found["train_batch_size"] == 128
    assert not {"tensorboard", "csv_monitor", "flops_profiler", "checkpoint"} & found.keys()
    assert found["zero_optimization"] == run["zero_optimization"] and found["fp16"] == {"enabled": True}
    assert found["zero_force_ds_cpu_optimizer"] is False
    # The run's own config is left as it was.
    assert run["gradient_accumulation_steps"] == 4 and "tensorboard" in run
