"""A DeepSpeed JSON with its own optimizer and scheduler sections (DeepSpeedExamples style).

DeepSpeed must build and step the JSON's optimizer and schedule (Accelerate's DummyOptim /
DummyScheduler), their "auto" values come from the training config, and checkpoint + resume
stays exact with them. Here: the checks made before any launch."""

from __future__ import annotations

import copy
import json

import pytest

from accel_mnist import TrainConfig
from accel_mnist.errors import UsageError
from accel_mnist.launch.optim_sections import check_deepspeed_optim
from tests.helpers import CONFIGS, DS_ADAM, DS_BASE, DS_DECAY, DS_SGD


def test_auto_values_are_filled_from_the_training_config():
    config = TrainConfig(lr=3e-3, weight_decay=0.01, momentum=0.8, optimizer="sgd", scheduler="cosine")
    ds = copy.deepcopy({**DS_BASE, "optimizer": DS_ADAM, "scheduler": DS_DECAY})
    notes = check_deepspeed_optim(ds, config)
    assert ds["optimizer"]["params"] == {"lr": 3e-3, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.01,
                                         "torch_adam": True}  # fmt: skip
    sched = ds["scheduler"]["params"]
    assert (sched["warmup_min_lr"], sched["warmup_max_lr"], sched["warmup_num_steps"]) == (0.0, 3e-3, 8)
    assert sched["total_num_steps"] == "auto"  # the run's length is known only at prepare
    assert len(notes) == 1 and "optimizer Adam (training config: sgd)" in notes[0]
    assert "scheduler WarmupDecayLR (training config: cosine)" in notes[0]

    ds = copy.deepcopy({**DS_BASE, "optimizer": DS_SGD})
    notes = check_deepspeed_optim(ds, TrainConfig())
    assert ds["optimizer"]["params"]["momentum"] == 0.9 and ds["zero_allow_untested_optimizer"] is True
    assert "lr 0.05 (training config: 0.001)" in notes[0]
    # The same optimizer and lr as the training config: nothing to say.
    assert check_deepspeed_optim(copy.deepcopy({**DS_BASE, "optimizer": DS_ADAM}), TrainConfig()) == []


@pytest.mark.parametrize(
    "sections, match",
    [
        ({"optimizer": {"type": "Adamm", "params": {}}}, "optimizer type 'Adamm'"),
        ({"optimizer": {"type": "Adam", "params": {"amsgrad": "auto"}}}, r"optimizer.params.amsgrad is \"auto\""),
        ({"scheduler": {"type": "Warmup", "params": {}}}, "scheduler type 'Warmup'"),
        ({"scheduler": {"type": "OneCycle", "params": {"cycle_max_lr": "auto"}}}, "scheduler.params.cycle_max_lr"),
        ({"optimizer": {"params": {"lr": 0.1}}}, 'needs a "type"'),
    ],
)
def test_sections_deepspeed_would_reject_are_refused(sections, match):
    with pytest.raises(UsageError, match=match):
        check_deepspeed_optim({**DS_BASE, **copy.deepcopy(sections)}, TrainConfig())


def test_shipped_example_json_is_complete():
    """accelerate_configs/deepspeed_optim_sched.json: every "auto" is one accel_mnist fills."""
    ds = json.loads((CONFIGS / "deepspeed_optim_sched.json").read_text())
    assert ds["optimizer"]["type"] == "Adam" and ds["scheduler"]["type"] == "WarmupDecayLR"
    check_deepspeed_optim(ds, TrainConfig())
    assert ds["optimizer"]["params"]["lr"] == 1e-3 and ds["scheduler"]["params"]["warmup_max_lr"] == 1e-3
    yaml_text = (CONFIGS / "zero_file_optim_sched.yaml").read_text()
    assert "deepspeed_config_file: accelerate_configs/deepspeed_optim_sched.json" in yaml_text
