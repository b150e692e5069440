"""TORCH_CUDA_ARCH_LIST for the ops DeepSpeed compiles: DeepSpeed's own op builder judges a value,
and an unset one is filled from the visible GPUs (simulated here; the real run is a GPU test in
tests/launch/test_deepspeed_ops_gpu.py)."""

from __future__ import annotations

import os

import pytest
import torch

from accel_mnist.distributed import deepspeed_ops
from accel_mnist.distributed.deepspeed_ops import VARIABLE, align_cuda_arch_list, deepspeed_arch_problem

pytest.importorskip("deepspeed")


@pytest.fixture
def hopper(monkeypatch):
    """Two visible devices of compute capability 9.0, as torch reports an H200's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.delenv(VARIABLE, raising=False)


def test_deepspeed_reads_plain_entries_and_says_why_it_cannot_read_others(monkeypatch):
    monkeypatch.setenv(VARIABLE, "untouched")
    assert deepspeed_arch_problem("8.0;9.0+PTX") is None
    problem = deepspeed_arch_problem("9.0a")
    if problem is None:
        pytest.skip("this DeepSpeed reads architecture-specific entries (9.0a): nothing to work around")
    assert "invalid literal for int() with base 10: '0a'" in problem
    assert os.environ[VARIABLE] == "untouched"  # the builder's rewrite of the variable is undone


def test_an_unset_list_is_set_from_the_visible_devices_and_said(hopper):
    note = align_cuda_arch_list(uses_deepspeed=True)
    assert os.environ[VARIABLE] == "9.0"
    assert note is not None and note.startswith(f"{VARIABLE} was unset: set to 9.0 (the visible GPUs'")


def test_a_users_list_is_kept_and_reported_when_deepspeed_cannot_read_it(hopper, monkeypatch):
    monkeypatch.setenv(VARIABLE, "9.0")
    assert align_cuda_arch_list(uses_deepspeed=True) is None
    monkeypatch.setenv(VARIABLE, "9.0a")
    note = align_cuda_arch_list(uses_deepspeed=True)
    assert os.environ[VARIABLE] == "9.0a"
    if deepspeed_arch_problem("9.0a") is not None:
        assert note is not None and "cannot be read by DeepSpeed's op builder" in note and f"{VARIABLE}=9.0 " in note


def test_nothing_is_set_without_deepspeed_or_without_a_gpu(hopper, monkeypatch):
    assert align_cuda_arch_list(uses_deepspeed=False) is None
    monkeypatch.setattr(deepspeed_ops, "deepspeed_arch_problem", lambda value: pytest.fail("asked DeepSpeed"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert align_cuda_arch_list(uses_deepspeed=True) is None
    assert VARIABLE not in os.environ
