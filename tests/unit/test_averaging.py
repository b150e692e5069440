"""`ema_decay`'s average of the weights (training/averaging.py): its arithmetic, its swap, its checkpoint
state and where it is refused; runs with it: tests/e2e/test_averaging.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from accel_mnist.config import ConfigError, TrainConfig
from accel_mnist.distributed.option_rules import averaging_refusal
from accel_mnist.distributed.strategy import Strategy
from accel_mnist.models import BNCNN
from accel_mnist.training.averaging import WeightAverage, resident_bytes


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2))


def test_the_average_moves_toward_the_parameters_with_the_warm_up_weight():
    model = _model()
    average = WeightAverage(model, 0.9)
    expected = [p.detach().clone() for p in model.parameters()]
    for n in range(1, 6):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.5 * n)  # an optimizer step
        average.update()
        weight = 1 - min(0.9, (1 + n) / (10 + n))  # 0.82 at the first update, 0.1 from the ninth
        expected = [e + weight * (p.detach() - e) for e, p in zip(expected, model.parameters(), strict=True)]
    for got, want in zip(average.average, expected, strict=True):
        torch.testing.assert_close(got, want)
    assert average.updates == 5
    assert average.names == ["0.weight", "0.bias", "2.weight", "2.bias"]  # the state dict's names


def test_an_update_of_fp32_parameters_is_one_cat_and_one_lerp_whatever_their_number():
    model = BNCNN().to(memory_format=torch.channels_last)  # eleven parameter tensors, three channels-last
    average = WeightAverage(model, 0.9)
    expected = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        average.update()
    calls = {e.key: e.count for e in prof.key_averages()}
    assert (calls.get("aten::lerp_"), calls.get("aten::cat"), calls.get("aten::copy_", 0)) == (1, 1, 0)
    weight = 1 - min(0.9, 2 / 11)
    for got, e, p in zip(average.average, expected, model.parameters(), strict=True):
        assert torch.equal(got, e.lerp_(p.detach(), weight))  # the per-tensor arithmetic, bit for bit


def test_each_average_has_its_parameter_s_shape_and_layout_over_mixed_dtypes():
    model = BNCNN().to(memory_format=torch.channels_last)
    model.fc.to(torch.bfloat16)  # a second dtype: a buffer of its own, moved one tensor at a time
    average = WeightAverage(model, 0.5)
    assert len(average.flats) == 2
    for p, a in zip(model.parameters(), average.average, strict=True):
        assert a.dtype == torch.float32 and a.shape == p.shape
        assert all(s == t for s, t, n in zip(a.stride(), p.stride(), p.shape, strict=True) if n > 1)
        assert torch.equal(a, p.float())
    before = model.fc.weight.float()
    with torch.no_grad():
        model.fc.weight.add_(1.0)
    average.update()
    weight = 1 - min(0.5, 2 / 11)
    assert torch.equal(average.average[-2], before.lerp(model.fc.weight.float(), weight))


def test_swapped_puts_the_average_in_and_the_parameters_back_exactly():
    model = _model()
    average = WeightAverage(model, 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)
    average.update()
    trained = [p.detach().clone() for p in model.parameters()]
    assert not any(torch.equal(a, t) for a, t in zip(average.average, trained, strict=True))
    with average.swapped():
        for p, a in zip(model.parameters(), average.average, strict=True):
            assert torch.equal(p, a)
    for p, t in zip(model.parameters(), trained, strict=True):
        assert torch.equal(p, t)


def test_a_16_bit_model_evaluates_a_rounded_average_and_keeps_its_fp32_copy():
    model = _model().to(torch.bfloat16)
    average = WeightAverage(model, 0.5)
    with torch.no_grad():
        model[0].weight.add_(1 / 3)
    average.update()
    assert all(a.dtype == torch.float32 for a in average.average)
    kept = average.average[0].clone()
    with average.swapped():
        assert model[0].weight.dtype == torch.bfloat16
        torch.testing.assert_close(model[0].weight.float(), kept, atol=1e-2, rtol=1e-2)
    assert torch.equal(average.average[0], kept)  # the swap leaves the fp32 average as it was


def test_without_a_decay_nothing_is_held_or_changed():
    model = _model()
    before = [p.detach().clone() for p in model.parameters()]
    average = WeightAverage(model, None)
    average.update()
    with average.swapped():
        assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert average.average == [] and average.updates == 0
    assert resident_bytes(model, None) == 0


def test_a_checkpoint_s_average_loads_only_into_the_same_parameters():
    first = WeightAverage(_model(0), 0.9)
    with torch.no_grad():
        for p in first.params:
            p.add_(1.0)
    first.update()
    second = WeightAverage(_model(1), 0.9)
    second.load_state_dict(first.state_dict())
    assert second.updates == 1
    assert all(torch.equal(a, b) for a, b in zip(first.average, second.average, strict=True))
    other = WeightAverage(nn.Linear(3, 2), 0.9)
    for state in (first.state_dict(), {"updates": 1}, {"updates": "1", "average": {}}, [],
                  {"updates": 1, "average": {"0.weight": "not a tensor"}}):  # fmt: skip
        with pytest.raises(ValueError, match="do not fit"):
            other.load_state_dict(state)  # type: ignore[arg-type]


def test_resident_bytes_count_the_fp32_average_and_the_swap_copy_of_trainable_parameters():
    model = _model()
    model[2].bias.requires_grad_(False)  # frozen: not averaged
    trainable = 3 * 4 + 4 + 4 * 2
    assert resident_bytes(model, 0.9) == trainable * (4 + 4)
    assert resident_bytes(model.to(torch.bfloat16), 0.9) == trainable * (4 + 2)


@pytest.mark.parametrize(
    ("strategy", "refused"),
    [
        (Strategy(), False),
        (Strategy(kind="MULTI_GPU", device="cuda", num_processes=2), False),
        (Strategy(kind="DEEPSPEED", zero_stage=1), False),
        (Strategy(kind="DEEPSPEED", zero_stage=2, offload_optimizer="cpu"), False),
        (Strategy(kind="DEEPSPEED", zero_stage=3), True),
        (Strategy(kind="FSDP", device="cuda", fsdp_version=2), True),
        (Strategy(kind="FSDP", device="cuda", fsdp_version=1), True),
    ],
)
def test_the_average_is_refused_in_one_line_where_the_parameters_are_sharded(strategy, refused):
    why = averaging_refusal(strategy)
    assert (why is not None) == refused
    if why is not None:
        assert why.startswith("ema_decay: ") and "\n" not in why


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5, 1.5])
def test_a_decay_outside_zero_one_is_refused(decay):
    with pytest.raises(ConfigError, match="ema_decay"):
        TrainConfig(ema_decay=decay)
