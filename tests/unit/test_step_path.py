"""The direct optimizer step does what Accelerate's would, only where nothing else is decided."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType

from accel_mnist.distributed.lean_steps import DirectStep, StepCalls, direct_steps


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
    from accel_mnist.distributed.accelerator import build_accelerator
    from accel_mnist.distributed.prepare import prepare

    config = TrainConfig(output_dir=str(tmp_path), model="linear", grad_accum=1)
    accelerator = build_accelerator(config)
    try:
        _, optimizer, _ = prepare(accelerator, config, torch.nn.Linear(4, 2), 10, 10)
        assert isinstance(optimizer, DirectStep) and isinstance(optimizer.optimizer, torch.optim.Adam)
    finally:
        accelerator.free_memory()


def _micro(kind=DistributedType.NO, accum=1, scaler=None, sync=True):
    calls: list = []
    accelerator = SimpleNamespace(
        distributed_type=kind, gradient_accumulation_steps=accum, scaler=scaler, sync_gradients=sync,
        accumulate=lambda model: calls.append(("accumulate", model)) or contextlib.nullcontext(),
        backward=lambda loss: calls.append(("backward", loss)),
    )  # fmt: skip
    return StepCalls(accelerator), calls  # type: ignore[arg-type]


def test_one_micro_batch_per_step_needs_neither_accumulate_nor_the_division():
    micro, calls = _micro()
    param = torch.nn.Parameter(torch.tensor(3.0))
    with micro.accumulate("model"):
        micro.backward(param * 2)
    assert calls == [] and param.grad == 2.0  # loss.backward() itself: nothing divided


@pytest.mark.parametrize(
    "kwargs", [{"accum": 2}, {"kind": DistributedType.DEEPSPEED}, {"kind": DistributedType.FSDP},
               {"kind": DistributedType.XLA}],
)  # fmt: skip
def test_accumulation_or_other_strategies_keep_accelerates_calls(kwargs):
    micro, calls = _micro(**kwargs)
    with micro.accumulate("model"):
        micro.backward(torch.tensor(1.0))
    assert [name for name, _ in calls] == ["accumulate", "backward"]


def test_a_stale_sync_flag_is_left_to_accelerate_to_set():
    # sync_gradients=False with one micro-batch per step: an earlier run in the process left it.
    micro, calls = _micro(sync=False)
    with micro.accumulate("model"):
        pass
    assert [name for name, _ in calls] == ["accumulate"]


def test_a_grad_scaler_keeps_accelerates_backward():
    micro, calls = _micro(scaler=object())
    with micro.accumulate("model"):
        micro.backward(torch.tensor(1.0))
    assert [name for name, _ in calls] == ["backward"]  # the scaler scales the loss there


@pytest.mark.parametrize("name", ["none", "onecycle", "cosine", "step"])
def test_only_the_none_schedule_goes_unstepped(name):
    from accelerate.scheduler import AcceleratedScheduler

    from accel_mnist.config import TrainConfig
    from accel_mnist.optim import is_constant, torch_scheduler

    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.SGD([param], lr=0.5)
    schedule = torch_scheduler(optimizer, TrainConfig(scheduler=name, lr=0.5), total_steps=10, steps_per_epoch=5)
    wrapped = AcceleratedScheduler(schedule, optimizer, step_with_optimizer=False)
    assert is_constant(schedule) is is_constant(wrapped) is (name == "none")
    if name == "none":  # stepping it would change nothing: the learning rate stays the optimizer's
        lrs = []
        for _ in range(3):
            optimizer.step()
            schedule.step()
            lrs.append(schedule.get_last_lr()[0])
        assert lrs == [0.5, 0.5, 0.5]
    # Another LambdaLR (a caller's) is stepped.
    assert not is_constant(torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0))


def test_the_step_trains_on_the_smoothed_loss():
    """label_smoothing reaches the step's loss: torch's smoothed cross entropy, not the plain one."""
    import torch.nn.functional as F

    from accel_mnist import TrainConfig
    from accel_mnist.training.step import EagerStep

    torch.manual_seed(0)
    model, inputs, labels = torch.nn.Linear(6, 3), torch.randn(8, 6), torch.randint(0, 3, (8,))
    accelerator = SimpleNamespace(distributed_type=DistributedType.NO, gradient_accumulation_steps=1, scaler=None)
    step = EagerStep(accelerator, TrainConfig(label_smoothing=0.2), model, None)  # type: ignore[arg-type]
    logits = model(inputs)
    smoothed = F.cross_entropy(logits, labels, label_smoothing=0.2).item()
    assert step.loss(inputs, labels).item() == pytest.approx(smoothed)
    assert abs(step.loss(inputs, labels).item() - F.cross_entropy(logits, labels).item()) > 1e-3
