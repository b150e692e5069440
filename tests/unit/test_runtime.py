"""runtime.py builds the Accelerator without changing Accelerate itself."""

from __future__ import annotations

import inspect

import accelerate.accelerator
import accelerate.optimizer
import accelerate.utils
import pytest

from accel_mnist import TrainConfig
from accel_mnist.distributed.accelerator import build_accelerator


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
    from accel_mnist.distributed.accelerator import _align_deepspeed

    ds: dict = {"zero_optimization": {"stage": 2}}
    _align_deepspeed(_fake_deepspeed_accelerator(mixed_precision, ds), TrainConfig(), 1)  # type: ignore[arg-type]
    assert ds.get("data_types", {}).get("buffer_dtype") == expected


def test_a_deepspeed_json_keeps_its_own_buffer_dtype():
    from accel_mnist.distributed.accelerator import _align_deepspeed

    ds: dict = {"zero_optimization": {"stage": 2}, "data_types": {"buffer_dtype": "fp32"}}
    _align_deepspeed(_fake_deepspeed_accelerator("fp16", ds), TrainConfig(), 1)  # type: ignore[arg-type]
    assert ds["data_types"]["buffer_dtype"] == "fp32"


@pytest.mark.parametrize("name", ["adam", "adamw", "sgd"])
def test_allocated_optimizer_state_changes_nothing_a_checkpoint_does_not_overwrite(name):
    """The slots made before an FSDP1 sharded resume: parameters untouched, every state key of
    a trained optimizer present, and once that state is loaded the next step is the trained one's."""
    import copy

    import torch

    from accel_mnist.distributed.prepare import allocate_optimizer_state

    def make(model):
        if name == "sgd":
            return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.01)
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        return cls(model.parameters(), lr=0.01, weight_decay=0.01)

    def step(model, opt):
        model(torch.ones(4, 3)).square().sum().backward()
        opt.step()
        opt.zero_grad()

    torch.manual_seed(0)
    trained = torch.nn.Linear(3, 2)
    trained_opt = make(trained)
    for _ in range(3):
        step(trained, trained_opt)
    fresh = copy.deepcopy(trained)
    fresh_opt = make(fresh)
    before = [p.detach().clone() for p in fresh.parameters()]
    allocate_optimizer_state(fresh_opt)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters(), strict=True))
    assert all(p.grad is None for p in fresh.parameters())
    assert [g["lr"] for g in fresh_opt.param_groups] == [g["lr"] for g in trained_opt.param_groups]
    saved = trained_opt.state_dict()["state"]
    assert {k: set(v) for k, v in fresh_opt.state_dict()["state"].items()} == {k: set(v) for k, v in saved.items()}
    fresh_opt.load_state_dict(copy.deepcopy(trained_opt.state_dict()))  # load_state_dict shares tensors
    step(trained, trained_opt)
    step(fresh, fresh_opt)
    assert all(torch.equal(a, b) for a, b in zip(trained.parameters(), fresh.parameters(), strict=True))
