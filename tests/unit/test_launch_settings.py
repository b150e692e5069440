"""Launcher and accelerate-config settings are honoured or refused, never dropped in silence;
every refusal comes before the output directory exists. Here: the checks, in process."""

from __future__ import annotations

import os

import pytest

from accel_mnist import TrainConfig
from accel_mnist.errors import ConfigError, UsageError
from accel_mnist.launch.settings import DEEPSPEED_WITH_CPU, FSDP_WITH_CPU, check_launch
from tests.helpers import CONFIGS, REPO, WIZARD_MULTI_CPU


@pytest.fixture
def no_accelerate_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith("ACCELERATE_"):
            monkeypatch.delenv(key)
    return monkeypatch


def test_grad_accum_unset_resolves_to_the_launchers_value(no_accelerate_env):
    config = TrainConfig()
    assert check_launch(config).grad_accum == 1 and config.grad_accum is None  # nothing asked: 1; config as given
    no_accelerate_env.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    config = TrainConfig()
    settings = check_launch(config)
    assert (settings.grad_accum, config.grad_accum, settings.notes) == (4, None, [])
    config = TrainConfig(grad_accum=2)  # set in the training config: it wins, and says so
    settings = check_launch(config)
    assert settings.grad_accum == 2 and config.grad_accum == 2
    assert len(settings.notes) == 1 and "ACCELERATE_GRADIENT_ACCUMULATION_STEPS is 4" in settings.notes[0]
    assert "using grad_accum=2" in settings.notes[0]


def test_a_global_batch_refuses_the_launchers_accumulation(no_accelerate_env):
    config = TrainConfig(batch_size="auto", global_batch_size=256)  # type: ignore[arg-type]
    assert check_launch(config).grad_accum == 1  # chosen later, by the memory plan
    no_accelerate_env.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")
    assert check_launch(config).grad_accum == 1  # the launcher's default: nothing asked
    no_accelerate_env.setenv("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "4")
    with pytest.raises(ConfigError, match=r"^global_batch_size: chooses the accumulation, but "
                       r"ACCELERATE_GRADIENT_ACCUMULATION_STEPS is 4; leave one of them out$"):  # fmt: skip
        check_launch(config)


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


SIMPLE_LAUNCHER_CPU = {"ACCELERATE_USE_CPU": "True"}  # what `accelerate launch --cpu` exports, and nothing else


@pytest.mark.parametrize(
    "argv, env, refusal",
    [
        # --cpu: accelerate runs one plain process and exports nothing of DeepSpeed or FSDP.
        (["--cpu", "--config_file", "zero2.yaml"], SIMPLE_LAUNCHER_CPU, DEEPSPEED_WITH_CPU),
        (["--cpu", "--config_file", "zero3.yaml"], SIMPLE_LAUNCHER_CPU, DEEPSPEED_WITH_CPU),
        (["--cpu", "--config_file", "fsdp.yaml"], SIMPLE_LAUNCHER_CPU, FSDP_WITH_CPU),
        # use_cpu: true in the YAML: DeepSpeed's and FSDP's launchers never export it.
        (["--config_file", "USE_CPU/zero2.yaml"], {"ACCELERATE_USE_DEEPSPEED": "true"}, DEEPSPEED_WITH_CPU),
        (["--config_file", "USE_CPU/fsdp.yaml"], {"ACCELERATE_USE_FSDP": "true"}, FSDP_WITH_CPU),
        (["--use_fsdp", "--config_file", "cpu.yaml"], {"ACCELERATE_USE_FSDP": "true"}, FSDP_WITH_CPU),
        # ACCELERATE_USE_CPU exported by hand reaches every launcher's workers.
        (["--config_file", "zero2.yaml"], {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_CPU": "true"},
         DEEPSPEED_WITH_CPU),
        (["--config_file", "fsdp.yaml"], {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_CPU": "true"}, FSDP_WITH_CPU),
        (None, {"ACCELERATE_USE_FSDP": "true", "ACCELERATE_USE_CPU": "true"}, FSDP_WITH_CPU),  # no accelerate launch
        # Asked for alone, each is honoured.
        (["--cpu", "--config_file", "cpu.yaml"], SIMPLE_LAUNCHER_CPU, None),
        (["--config_file", "multi_cpu.yaml"], {}, None),  # DDP on the CPU: MULTI_GPU with use_cpu: true
        (["--config_file", "zero2.yaml"], {"ACCELERATE_USE_DEEPSPEED": "true"}, None),  # DeepSpeed, on the CPU here
        (["--multi_gpu", "--config_file", "USE_CPU/zero2.yaml"], {}, None),  # the flag wins over the YAML's DEEPSPEED
    ],
    ids=["--cpu zero2", "--cpu zero3", "--cpu fsdp", "use_cpu zero2", "use_cpu fsdp", "use_cpu --use_fsdp",
         "env zero2", "env fsdp", "env python fsdp", "--cpu cpu", "multi_cpu", "zero2", "--multi_gpu use_cpu zero2"],
)  # fmt: skip
def test_deepspeed_or_fsdp_with_the_cpu_is_refused(argv, env, refusal, tmp_path, no_accelerate_env):
    """Each way a launch asks for the CPU and for DeepSpeed or FSDP, as the worker sees it: its
    environment and its launcher's command line (None: no `accelerate launch`)."""
    for name in ("zero2.yaml", "fsdp.yaml"):  # the shipped YAML with use_cpu: true
        (tmp_path / name).write_text((CONFIGS / name).read_text().replace("use_cpu: false", "use_cpu: true"))
    files = {a: str(tmp_path / a[8:] if a.startswith("USE_CPU/") else CONFIGS / a) for a in argv or [] if "yaml" in a}
    args = parsed_launch(*[files.get(a, a) for a in argv]) if argv is not None else None
    no_accelerate_env.setattr("accel_mnist.launch.settings.launcher_args", lambda: args)
    for key, value in {"ACCELERATE_MIXED_PRECISION": "no", **env}.items():
        no_accelerate_env.setenv(key, value)
    if refusal is None:
        check_launch(TrainConfig())
    else:
        with pytest.raises(UsageError) as refused:
            check_launch(TrainConfig())
        assert str(refused.value) == refusal


def test_a_script_that_asks_for_the_cpu_gets_neither_deepspeed_nor_fsdp(tmp_path, no_accelerate_env):
    """`build_accelerator(config, cpu=True)`: the script's own Accelerator(cpu=True)."""
    ds_json = tmp_path / "ds.json"
    ds_json.write_text('{"zero_optimization": {"stage": 2}}')
    with pytest.raises(UsageError) as refused:
        check_launch(TrainConfig(deepspeed_config=str(ds_json)), cpu=True)
    assert str(refused.value) == DEEPSPEED_WITH_CPU
    no_accelerate_env.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(UsageError) as refused:
        check_launch(TrainConfig(), cpu=True)
    assert str(refused.value) == FSDP_WITH_CPU
    no_accelerate_env.delenv("ACCELERATE_USE_FSDP")
    check_launch(TrainConfig(), cpu=True)  # the CPU alone
