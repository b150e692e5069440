"""The per-step shortcuts runtime.py takes inside accelerate: same answers, fewer costs."""

from __future__ import annotations

import inspect

import accelerate.optimizer
import pytest
import torch
from accelerate import Accelerator

from accel_mnist import TrainConfig
from accel_mnist.runtime import _CachedSignatures, _speed_up_accelerate, build_accelerator


class _NoSetToNone(torch.optim.SGD):
    def zero_grad(self):  # type: ignore[override]
        super().zero_grad(set_to_none=False)


def test_cached_signatures_match_inspect():
    cached = _CachedSignatures()
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))])
    other = torch.optim.Adam([torch.nn.Parameter(torch.zeros(3))])
    for method in (
        opt.zero_grad,
        other.zero_grad,
        opt.step,
        _NoSetToNone([torch.nn.Parameter(torch.zeros(1))]).zero_grad,
    ):
        assert cached.signature(method) == inspect.signature(method)
    assert cached.signature(len) == inspect.signature(len)  # not a method: passed through
    assert cached.Parameter is inspect.Parameter  # everything else is inspect's own


def test_accelerated_zero_grad_still_honours_the_optimizer_signature(tmp_path):
    _speed_up_accelerate()
    assert isinstance(accelerate.optimizer.inspect, _CachedSignatures)
    accelerator = Accelerator(cpu=True, project_dir=str(tmp_path))
    param, plain = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    sgd = accelerator.prepare(torch.optim.SGD([param], lr=0.1))
    no_arg = accelerator.prepare(_NoSetToNone([plain], lr=0.1))
    for _ in range(2):  # the second round answers from the cache
        (param.sum() + plain.sum()).backward()
        sgd.zero_grad()
        no_arg.zero_grad()
        assert param.grad is None  # set_to_none=True, accelerate's default
        assert torch.equal(plain.grad, torch.zeros(3))  # zero_grad() called without the argument
    with pytest.raises(ValueError, match="set_to_none"):
        no_arg.zero_grad(set_to_none=True)
    accelerator.free_memory()


def test_build_accelerator_caches_the_lomo_check(tmp_path):
    build_accelerator(TrainConfig(output_dir=str(tmp_path)))
    assert hasattr(accelerate.optimizer.is_lomo_available, "cache_info")
