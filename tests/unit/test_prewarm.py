"""The warm-up step runs on a copy: the model and the RNG are left as they were."""

from __future__ import annotations

import pytest
import torch

from accel_mnist import TrainConfig
from accel_mnist.training.prewarm import prewarm


def test_prewarm_leaves_model_and_rng_alone():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Dropout(0.5), torch.nn.Linear(784, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    seconds = prewarm(model, TrainConfig(batch_size=8, eval_batch_size=4), torch.device("cpu"), 13)
    assert seconds > 0
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(rng, torch.get_rng_state())  # the copy's dropout drew from a forked stream


class Recorder(torch.nn.Module):
    """A 4-D-input model that notes, per forward, the batch size, autocast and the input's layout."""

    seen: list[tuple[int, bool, bool]] = []  # a class attribute: prewarm's deep copy records here too

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 2, 3)  # 3 channels: with 1, both layouts have the same strides
        self.head = torch.nn.Linear(2 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        Recorder.seen.append((x.shape[0], torch.is_autocast_enabled("cpu"), channels_last))
        return self.head(self.conv(x).flatten(1))


def test_prewarm_computes_in_the_runs_precision_and_layout():
    # Kernels load per dtype and layout: a bf16 run warmed in fp32 would load its own inside the clock.
    Recorder.seen = []
    config = TrainConfig(batch_size=8, eval_batch_size=4, channels_last=True)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    prewarm(Recorder(), config, torch.device("cpu"), 13, input_shape=(3, 8, 8), autocast=bf16)
    assert Recorder.seen == [(8, True, True), (5, True, True), (4, True, True)]  # both training shapes, then eval
    Recorder.seen = []
    prewarm(Recorder(), config.replace(channels_last=False), torch.device("cpu"), 16, input_shape=(3, 8, 8))
    assert Recorder.seen == [(8, False, False), (4, False, False)]


def test_the_copy_computes_as_the_strategy_prepares_the_model():
    """FSDP2 at 16 bits keeps BatchNorm's statistics in 16 bits and computes without autocast: an fp32 copy
    under autocast beside them failed (issue 35: bncnn + prewarm under fsdp2.yaml); the strategy's rule runs."""
    from accel_mnist.distributed.option_rules import cast_float_buffers
    from accel_mnist.distributed.strategy import CopyPrecision, Strategy
    from accel_mnist.models import build_model

    def copy_precision(kind: str, precision: str, fsdp_version: int = 0) -> CopyPrecision:
        return Strategy(kind=kind, precision=precision, fsdp_version=fsdp_version).copy_precision

    assert copy_precision("FSDP", "bf16", 2) == CopyPrecision("bf16", autocast=False)
    assert copy_precision("FSDP", "bf16", 1) == CopyPrecision("bf16", autocast=True)
    assert copy_precision("DEEPSPEED", "fp16") == CopyPrecision("fp16", autocast=False)
    assert copy_precision("DEEPSPEED", "no") == CopyPrecision(None, autocast=False)
    assert copy_precision("MULTI_GPU", "bf16") == CopyPrecision(None, autocast=True)
    model = build_model("bncnn", None, 10)
    cast_float_buffers(model, torch.bfloat16)  # what training/start.py does under FSDP2 at bf16
    before = {k: v.clone() for k, v in model.state_dict().items()}
    config = TrainConfig(model="bncnn", batch_size=8, eval_batch_size=8)

    def autocast():
        return torch.autocast("cpu", dtype=torch.bfloat16)

    with pytest.raises(RuntimeError):  # the old copy: fp32 weights, 16-bit statistics, under autocast
        prewarm(model, config, torch.device("cpu"), autocast=autocast)
    assert (
        prewarm(model, config, torch.device("cpu"), autocast=autocast, precision=copy_precision("FSDP", "bf16", 2)) > 0
    )
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the run's model untouched
