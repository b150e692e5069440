"""The direct optimizer step does what Accelerate's would, only where nothing else is decided."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

from accel_mnist.step_path import DirectStep, direct_steps


def _prepared(scaler=None):
    param = torch.nn.Parameter(torch.ones(3))
    inner = torch.optim.SGD([param], lr=0.5)
    calls: list = []
    prepared = SimpleNamespace(optimizer=inner, scaler=scaler, step_was_skipped=False,
                               zero_grad=lambda set_to_none=None: calls.append(set_to_none))  # fmt: skip
    return param, prepared, calls


def _accelerator(kind=DistributedType.NO, sync=True):
    return SimpleNamespace(distributed_type=kind, sync_gradients=sync)


@pytest.mark.parametrize("sync", [True, False])
def test_steps_and_zeroes_only_at_an_accumulation_boundary(sync):
    param, prepared, _ = _prepared()
    opt = direct_steps(_accelerator(sync=sync), prepared)  # type: ignore[arg-type]
    assert isinstance(opt, DirectStep)
    param.grad = torch.full((3,), 2.0)
    opt.step()
    opt.zero_grad()
    assert torch.equal(param.detach(), torch.zeros(3) if sync else torch.ones(3))
    assert (param.grad is None) is sync  # between boundaries the gradients keep accumulating
    assert opt.step_was_skipped is False  # anything else is the prepared optimizer's


@pytest.mark.parametrize("kind", [DistributedType.DEEPSPEED, DistributedType.FSDP, DistributedType.XLA])
def test_sharded_or_other_strategies_keep_accelerates_step(kind):
    _, prepared, _ = _prepared()
    assert direct_steps(_accelerator(kind), prepared) is prepared  # type: ignore[arg-type]


def test_a_grad_scaler_keeps_accelerates_step():
    _, prepared, _ = _prepared(scaler=object())
    assert direct_steps(_accelerator(), prepared) is prepared  # type: ignore[arg-type]


def test_an_explicit_set_to_none_goes_to_accelerate():
    _, prepared, calls = _prepared()
    opt = direct_steps(_accelerator(), prepared)  # type: ignore[arg-type]
    opt.zero_grad(set_to_none=False)
    assert calls == [False]


def test_the_loop_gets_the_direct_step_on_one_cpu_process(tmp_path):
    from accel_mnist import TrainConfig
    from accel_mnist.runtime import build_accelerator, prepare

    config = TrainConfig(output_dir=str(tmp_path), model="linear", grad_accum=1)
    accelerator = build_accelerator(config)
    try:
        _, optimizer, _ = prepare(accelerator, config, torch.nn.Linear(4, 2), 10, 10)
        assert isinstance(optimizer, DirectStep) and isinstance(optimizer.optimizer, torch.optim.Adam)
    finally:
        accelerator.free_memory()
