"""Launcher and accelerate-config settings are honoured or refused, never dropped in silence;
every refusal comes before the output directory exists."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accel_mnist import TrainConfig
from accel_mnist.distributed.launch_settings import check_launch
from accel_mnist.errors import UsageError
from tests.helpers import CONFIGS, MNIST_DIR, REPO, accelerate_launch

QUICK = ["--model", "linear", "--max-steps", "2", "--eval-every", "0", "--no-download", "--no-export",
         "--no-save-checkpoints", "--eval-batch-size", "5000"]  # fmt: skip


def run_module(env: dict[str, str], out: Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m accel_mnist train` (one process, no launcher) with ACCELERATE_* set as a launcher would."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    cmd = [sys.executable, "-m", "accel_mnist", "train", *QUICK, "--output-dir", str(out), "--quiet", *args]
    full_env = {**clean, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=full_env, cwd=REPO)


@pytest.fixture
def data():
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")


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


def json_file(tmp_path: Path, **extra) -> str:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, **extra}))
    return str(path)


REFUSALS = {
    "fp16_on_cpu": ({"ACCELERATE_MIXED_PRECISION": "fp16"}, "fp16 needs a GPU"),
    "fp8_without_backend": ({"ACCELERATE_MIXED_PRECISION": "fp8"}, "fp8 needs one of torchao, transformer_engine"),
    "deepspeed_with_cpu": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_CPU": "true"}, "leave out --cpu"),
    "megatron": ({"ACCELERATE_USE_MEGATRON_LM": "true"}, "Megatron-LM"),
    "bad_env_grad_accum": ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "two"}, "ACCELERATE_GRADIENT_ACCUMULATION"),
    "missing_ds_json": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "nope.json"},
                        "nope.json does not exist"),
    "yaml_field_next_to_ds_json": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "{json}",
                                    "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file,zero_stage"},
                                   "sets zero_stage next to deepspeed_config_file"),
    "ds_json_auto_nobody_fills": ({"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_DEEPSPEED_CONFIG_FILE": "{json}"},
                                  'optimizer.params.amsgrad is "auto"'),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REFUSALS))
def test_refusal_is_one_line_and_leaves_no_output_dir(name, tmp_path, data):
    env, message = REFUSALS[name]
    bad_json = json_file(tmp_path, optimizer={"type": "Adam", "params": {"amsgrad": "auto"}})
    env = {k: v.replace("{json}", bad_json) for k, v in env.items()}
    out = tmp_path / "never" / "run"
    proc = run_module(env, out)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert lines[-1].startswith("error: ") and message in lines[-1], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "never").exists(), "a refusal must not create the output directory"


def test_env_grad_accum_is_honoured_when_the_config_leaves_it_unset(tmp_path, data):
    proc = run_module({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "3"}, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["global_batch_size"] == 64 * 3
    assert json.loads((tmp_path / "run" / "config.json").read_text())["grad_accum"] == 3  # stored resolved


@pytest.mark.slow
def test_launch_flag_grad_accum_outside_deepspeed(tmp_path, data):
    """accelerate launch parses --gradient_accumulation_steps and drops it outside DeepSpeed;
    accel_mnist reads it from the launcher's command line."""
    launch = ["--config_file", str(CONFIGS / "cpu.yaml"), "--gradient_accumulation_steps", "4"]
    proc, results = accelerate_launch(launch, QUICK, tmp_path / "unset")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["global_batch_size"] == 64 * 4 and "grad_accum" not in proc.stderr
    proc, results = accelerate_launch(launch, [*QUICK, "--grad-accum", "2"], tmp_path / "set")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["global_batch_size"] == 64 * 2
    assert proc.stderr.count("accelerate launch --gradient_accumulation_steps is 4") == 1, proc.stderr[-3000:]
    assert "using grad_accum=2" in proc.stderr


WIZARD_MULTI_CPU = """\
compute_environment: LOCAL_MACHINE
debug: false
distributed_type: MULTI_CPU
downcast_bf16: 'no'
enable_cpu_affinity: false
machine_rank: 0
main_training_function: main
mixed_precision: 'no'
num_machines: 1
num_processes: 2
rdzv_backend: static
same_network: true
tpu_env: []
tpu_use_cluster: false
tpu_use_sudo: false
use_cpu: true
"""


@pytest.mark.slow
def test_wizard_multi_cpu_that_starts_one_process_is_refused(tmp_path, data):
    config = tmp_path / "multi_cpu_wizard.yaml"
    config.write_text(WIZARD_MULTI_CPU)
    out = tmp_path / "never" / "run"
    proc, _ = accelerate_launch(["--config_file", str(config)], QUICK, out)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "asks for 2 processes (distributed_type: MULTI_CPU)" in errors[0], proc.stderr
    assert "accelerate_configs/multi_cpu.yaml" in errors[0] and "mpirun" in errors[0]
    assert not (tmp_path / "never").exists()


@pytest.mark.gpu
def test_fp8_reports_converted_layers_or_refuses(tmp_path, data):
    """On a GPU with an fp8 backend: mlp's middle Linear (512->256) is converted and named; the
    linear model has no layer torchao converts (its only Linear is first and last) and is refused."""
    import torch
    from accelerate.utils import is_fp8_available

    if not torch.cuda.is_available() or not is_fp8_available():
        pytest.skip("needs a CUDA GPU and torchao, transformer_engine or msamp")
    env = {"ACCELERATE_MIXED_PRECISION": "fp8"}
    proc = run_module(env, tmp_path / "mlp", "--model", "mlp", "--max-steps", "20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fp8 (" in proc.stderr and "layers: net.3" in proc.stderr, proc.stderr[-3000:]
    proc = run_module(env, tmp_path / "linear", "--model", "linear")
    assert proc.returncode == 2 and "converts no layer" in proc.stderr.strip().splitlines()[-1], proc.stderr[-3000:]
    assert not (tmp_path / "linear").exists()  # refused before the output directory


def test_fp8_convertible_layers_follow_accelerates_filter():
    from accel_mnist.distributed.strategy import fp8_convertible_layers
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
    no_accelerate_env.setattr("accel_mnist.distributed.launch_settings.launcher_args", lambda: args)
    no_accelerate_env.delenv("WORLD_SIZE", raising=False)
    if refused:
        with pytest.raises(UsageError, match="started only this one"):
            check_launch(TrainConfig())
    else:
        check_launch(TrainConfig())


def test_gradient_clipping_flag_outside_deepspeed_is_reported(no_accelerate_env):
    args = parsed_launch("--config_file", str(CONFIGS / "cpu.yaml"), "--gradient_clipping", "1.0")
    no_accelerate_env.setattr("accel_mnist.distributed.launch_settings.launcher_args", lambda: args)
    notes = check_launch(TrainConfig()).notes
    assert len(notes) == 1 and "--gradient_clipping 1.0 only applies to DeepSpeed" in notes[0]
