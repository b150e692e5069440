"""Launcher and accelerate-config settings are honoured or refused, never dropped in silence;
every refusal comes before the output directory exists. Here: through `accelerate launch`, and for
DeepSpeed or FSDP with the CPU through torchrun, DeepSpeed's launcher and `python -m` too."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from accel_mnist.launch.launchers import free_port
from accel_mnist.launch.settings import DEEPSPEED_WITH_CPU, FSDP_WITH_CPU
from tests.helpers import (
    CONFIGS,
    QUICK_TRAIN_ARGS,
    WIZARD_MULTI_CPU,
    accelerate_launch,
    console_script,
    run_command,
)


@pytest.mark.slow
def test_launch_flag_grad_accum_outside_deepspeed(tmp_path, mnist_dir):
    """accelerate launch parses --gradient_accumulation_steps and drops it outside DeepSpeed;
    accel_mnist reads it from the launcher's command line."""
    launch = ["--config_file", str(CONFIGS / "cpu.yaml"), "--gradient_accumulation_steps", "4"]
    proc, results = accelerate_launch(launch, QUICK_TRAIN_ARGS, tmp_path / "unset")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["global_batch_size"] == 64 * 4 and "grad_accum" not in proc.stderr
    proc, results = accelerate_launch(launch, [*QUICK_TRAIN_ARGS, "--grad-accum", "2"], tmp_path / "set")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert results["global_batch_size"] == 64 * 2
    assert proc.stderr.count("accelerate launch --gradient_accumulation_steps is 4") == 1, proc.stderr[-3000:]
    assert "using grad_accum=2" in proc.stderr


@pytest.mark.slow
def test_wizard_multi_cpu_that_starts_one_process_is_refused(tmp_path, mnist_dir):
    config = tmp_path / "multi_cpu_wizard.yaml"
    config.write_text(WIZARD_MULTI_CPU)
    out = tmp_path / "never" / "run"
    proc, _ = accelerate_launch(["--config_file", str(config)], QUICK_TRAIN_ARGS, out)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "asks for 2 processes (distributed_type: MULTI_CPU)" in errors[0], proc.stderr
    assert "accelerate_configs/multi_cpu.yaml" in errors[0] and "mpirun" in errors[0]
    assert not (tmp_path / "never").exists()


# How each spelling asks for the CPU: `--cpu` on accelerate launch, `use_cpu: true` in the YAML (which
# DeepSpeed's and FSDP's launchers never pass on), or ACCELERATE_USE_CPU in the environment.
CPU_SPELLINGS = {
    "--cpu zero2": ("accelerate", "zero2.yaml", "--cpu"),
    "--cpu fsdp": ("accelerate", "fsdp.yaml", "--cpu"),
    "use_cpu zero2": ("accelerate", "zero2.yaml", "use_cpu"),
    "use_cpu fsdp": ("accelerate", "fsdp.yaml", "use_cpu"),
    "env zero2": ("accelerate", "zero2.yaml", "env"),
    "env fsdp": ("accelerate", "fsdp.yaml", "env"),
    "env torchrun json": ("torchrun", "json", "env"),  # DeepSpeed from --deepspeed_config alone
    "env deepspeed json": ("deepspeed", "json", "env"),
    "env python json": ("python", "json", "env"),
    "env python fsdp": ("python", "fsdp", "env"),  # what an FSDP launch exports, without the launcher
}


def _launch_with_the_cpu(spelling: str, tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """The command line (without --output-dir) and environment of one of CPU_SPELLINGS."""
    launcher, strategy, how = CPU_SPELLINGS[spelling]
    env = {"ACCELERATE_USE_CPU": "true"} if how == "env" else {}
    yaml = CONFIGS / strategy
    if how == "use_cpu":
        yaml = tmp_path / strategy
        yaml.write_text((CONFIGS / strategy).read_text().replace("use_cpu: false", "use_cpu: true"))
    prefix = {
        "accelerate": [console_script("accelerate"), "launch", "--config_file", str(yaml), "--mixed_precision", "no",
                       "--main_process_port", "0", *(["--cpu"] if how == "--cpu" else []), "-m"],
        "torchrun": [console_script("torchrun"), "--master_port", str(free_port()), "--nproc_per_node", "2", "-m"],
        "deepspeed": [console_script("deepspeed"), "--master_port", str(free_port()), "--num_gpus", "1",
                      "--module"],
        "python": [sys.executable, "-m"],
    }[launcher]  # fmt: skip
    args = list(QUICK_TRAIN_ARGS)
    if strategy == "json":
        args += ["--deepspeed_config", str(CONFIGS / "deepspeed_config.json")]
    elif launcher == "python":
        env.update(ACCELERATE_USE_FSDP="true", ACCELERATE_MIXED_PRECISION="no")
    return [*prefix, "accel_mnist", "train", *args], env


@pytest.mark.slow
@pytest.mark.parametrize("spelling", list(CPU_SPELLINGS))
def test_deepspeed_or_fsdp_with_the_cpu_is_refused_under_every_launcher(spelling, tmp_path, mnist_dir):
    """`--cpu` made accelerate launch train one plain process, and DeepSpeed's launcher trained
    ZeRO on two with `use_cpu: true` in the YAML: each way of asking for both is one error line."""
    cmd, env = _launch_with_the_cpu(spelling, tmp_path)
    out = tmp_path / "never" / "run"
    proc = run_command([*cmd, "--output-dir", str(out)], env=env, timeout=300)
    want = f"error: {FSDP_WITH_CPU if 'fsdp' in spelling else DEEPSPEED_WITH_CPU}"
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert errors == [want], proc.stdout[-2000:] + proc.stderr[-3000:]  # one line: the local main process's
    # The launchers add a traceback or a summary of their own for the worker's exit code 2; ours has none.
    assert "Traceback" not in proc.stderr.split(want)[0]
    assert proc.returncode == 2 or re.search(r"exit ?(status|code)[:= ]+2\b", proc.stderr), proc.stderr[-3000:]
    assert not out.parent.exists()
