"""Launcher and accelerate-config settings are honoured or refused, never dropped in silence;
every refusal comes before the output directory exists. Here: the checks, in process."""

from __future__ import annotations

import os

import pytest

from accel_mnist import TrainConfig
from accel_mnist.errors import UsageError
from accel_mnist.launch.settings import check_launch
from tests.helpers import CONFIGS, REPO, WIZARD_MULTI_CPU


@pytest.fixture
def no_accelerate_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("ACCELERATE_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_grad_accum_unset_resolves_to_the_launchers_value(no_accelerate_env):
    config = TrainConfig()
    assert check_launch(config).grad_accum == 1 and config.grad_accum == 1  # nothing asked: 1
    no_accelerate_env.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    config = TrainConfig()
    settings = check_launch(config)
    assert (settings.grad_accum, config.grad_accum, settings.notes) == (4, 4, [])
    config = TrainConfig(grad_accum=2)  # set in the training config: it wins, and says so
    settings = check_launch(config)
    assert settings.grad_accum == 2 and config.grad_accum == 2
    assert len(settings.notes) == 1 and "ACCELERATE_GRADIENT_ACCUMULATION_STEPS is 4" in settings.notes[0]
    assert "using grad_accum=2" in settings.notes[0]


def test_fp8_convertible_layers_follow_accelerates_filter():
    from accel_mnist.distributed.prepare import fp8_convertible_layers
    from accel_mnist.models import build_model

    assert fp8_convertible_layers(build_model("mlp")) == ["net.3"]
    assert fp8_convertible_layers(build_model("linear")) == []


def parsed_launch(*argv: str):
    """What launcher_args() returns for `accelerate launch ARGV -m accel_mnist train`."""
    from accelerate.commands.launch import launch_command_parser

    args, _ = launch_command_parser().parse_known_args([*argv, "-m", "accel_mnist", "train"])
    args._cwd = str(REPO)
    return args


@pytest.mark.parametrize(
    "argv, refused",
    [
        (["--config_file", "WIZARD"], True),  # the wizard's MULTI_CPU, 2 processes, simple launcher
        (["--config_file", str(CONFIGS / "cpu.yaml"), "--num_processes", "2"], True),
        (["--config_file", str(CONFIGS / "cpu.yaml")], False),
        (["--config_file", str(CONFIGS / "multi_cpu.yaml")], False),  # torchrun starts both
        (["--config_file", str(CONFIGS / "zero2.yaml")], False),
    ],
)
def test_process_count_check(argv, refused, tmp_path, no_accelerate_env):
    wizard = tmp_path / "wizard.yaml"
    wizard.write_text(WIZARD_MULTI_CPU)
    args = parsed_launch(*[str(wizard) if a == "WIZARD" else a for a in argv])
    no_accelerate_env.setattr("accel_mnist.launch.settings.launcher_args", lambda: args)
    no_accelerate_env.delenv("WORLD_SIZE", raising=False)
    if refused:
        with pytest.raises(UsageError, match="started only this one"):
            check_launch(TrainConfig())
    else:
        check_launch(TrainConfig())


def test_gradient_clipping_flag_outside_deepspeed_is_reported(no_accelerate_env):
    args = parsed_launch("--config_file", str(CONFIGS / "cpu.yaml"), "--gradient_clipping", "1.0")
    no_accelerate_env.setattr("accel_mnist.launch.settings.launcher_args", lambda: args)
    notes = check_launch(TrainConfig()).notes
    assert len(notes) == 1 and "--gradient_clipping 1.0 only applies to DeepSpeed" in notes[0]


def test_a_schedule_the_optimizer_cannot_run_is_refused_before_anything_starts(no_accelerate_env):
    """adadelta has no momentum for onecycle to cycle: torch's OneCycleLR raised a ValueError mid-setup."""
    with pytest.raises(UsageError, match="onecycle cycles the optimizer's momentum .* adadelta has none"):
        check_launch(TrainConfig(optimizer="adadelta", scheduler="onecycle"))
    check_launch(TrainConfig(optimizer="adadelta", scheduler="onecycle", cycle_momentum=False))
    check_launch(TrainConfig(optimizer="sgd", scheduler="onecycle"))  # SGD's momentum is cycled
