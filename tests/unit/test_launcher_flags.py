"""DeepSpeed's argument names and `--deepspeed_config` under any launcher: what is parsed, what
is refused (one `error:` line, exit code 2, no output directory), and the strategy line.

In process, without a launch: every refusal here comes before an Accelerator exists.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from accel_mnist import TrainConfig
from accel_mnist.cli import build_parser, config_from_args, main
from accel_mnist.distributed.strategy import Strategy
from accel_mnist.errors import UsageError
from accel_mnist.launch.launchers import process_group_of_one
from accel_mnist.launch.settings import check_launch, zero3_init
from tests.helpers import CONFIGS, REPO

# What the launchers export; none of it may leak in from the shell that runs the tests.
LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CROSS_RANK",
               "CROSS_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE")  # fmt: skip


@pytest.fixture
def env(monkeypatch):
    """No launcher variables; os.environ as it was afterwards (process_group_of_one writes it)."""
    saved = dict(os.environ)
    for key in list(os.environ):
        if key.startswith("ACCELERATE_") or key in LAUNCH_VARS:
            del os.environ[key]
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


def ds_json(tmp_path: Path, name: str = "ds.json", **content) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(content or {"train_batch_size": 64, "zero_optimization": {"stage": 2}}))
    return str(path)


def refused(capsys, tmp_path: Path, *argv: str) -> str:
    """Run `accel-mnist ARGV --output-dir ...` in process; return its one error line."""
    out = tmp_path / "never" / "run"
    code = main([*argv, "--output-dir", str(out), "--no-download"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    assert not (tmp_path / "never").exists(), "a refusal must not create the output directory"
    return err[0]


def parsed_launch(*argv: str):
    """What launcher_args() returns for `accelerate launch ARGV -m accel_mnist train`."""
    from accelerate.commands.launch import launch_command_parser

    args, _ = launch_command_parser().parse_known_args([*argv, "-m", "accel_mnist", "train"])
    args._cwd = str(REPO)
    return args


# ----------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("flag", ["--deepspeed_config", "--deepspeed-config"])
def test_deepspeeds_spelling_and_ours_set_the_training_config(flag):
    args = build_parser().parse_args(["--local_rank=0", "train", "--deepspeed", flag, "ds.json"])
    assert config_from_args(args).deepspeed_config == "ds.json"
    assert (args.local_rank, args.deepspeed) == (0, True)


def test_local_rank_is_read_before_and_after_the_subcommand():
    parser = build_parser()
    assert parser.parse_args(["--local_rank=3", "train"]).local_rank == 3  # where DeepSpeed's launcher puts it
    assert parser.parse_args(["train", "--local-rank=2"]).local_rank == 2  # torch.distributed.launch's spelling
    assert parser.parse_args(["train"]).local_rank is None


def test_a_config_file_and_train_take_the_json_too():
    assert TrainConfig.from_dict({"deepspeed_config": "ds.json"}).deepspeed_config == "ds.json"
    assert TrainConfig().deepspeed_config is None
    with pytest.raises(UsageError, match="deepspeed_config: must not be empty"):
        TrainConfig(deepspeed_config=" ")


# ----------------------------------------------------------------------------- refusals


def test_local_rank_must_match_the_launchers_variable(env, capsys, tmp_path):
    env.setenv("LOCAL_RANK", "1")
    assert "--local_rank 0 does not match this process's LOCAL_RANK=1" in refused(
        capsys, tmp_path, "--local_rank=0", "train"
    )


def test_local_rank_without_a_launcher_is_refused(env, capsys, tmp_path):
    assert "LOCAL_RANK is not set" in refused(capsys, tmp_path, "--local_rank=0", "train")


def test_deepspeed_switch_without_a_json(env, capsys, tmp_path):
    assert "--deepspeed needs --deepspeed_config" in refused(capsys, tmp_path, "train", "--deepspeed")


def test_deepspeed_config_without_deepspeed_installed(env, capsys, tmp_path):
    env.setitem(sys.modules, "deepspeed", None)  # import deepspeed fails; find_spec finds nothing
    line = refused(capsys, tmp_path, "train", "--deepspeed_config", ds_json(tmp_path))
    assert "asks for DeepSpeed, which is not installed: pip install deepspeed" in line


@pytest.mark.parametrize(
    "yaml, env_vars, kind",
    [
        ("multi_cpu.yaml", {}, "MULTI_GPU"),  # DDP: torchrun starts the processes
        ("cpu.yaml", {"ACCELERATE_USE_CPU": "true"}, "the CPU alone"),
        ("fsdp.yaml", {"ACCELERATE_USE_FSDP": "true"}, "FSDP"),
    ],
)
def test_a_json_under_accelerate_launch_of_another_strategy(env, capsys, tmp_path, yaml, env_vars, kind):
    env.setattr("accel_mnist.launch.settings.launcher_args", lambda: parsed_launch("--config_file",
                str(CONFIGS / yaml)))  # fmt: skip
    for key, value in {"ACCELERATE_MIXED_PRECISION": "no", **env_vars}.items():
        env.setenv(key, value)
    line = refused(capsys, tmp_path, "train", "--deepspeed_config", ds_json(tmp_path))
    assert f"the accelerate config asks for {kind}" in line and "for DeepSpeed" in line, line


def test_two_jsons_are_refused_one_is_not(env, capsys, tmp_path):
    theirs, ours = ds_json(tmp_path, "theirs.json"), ds_json(tmp_path, "ours.json")
    env.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    env.setenv("ACCELERATE_DEEPSPEED_CONFIG_FILE", theirs)
    line = refused(capsys, tmp_path, "train", "--deepspeed_config", ours)
    assert f"two DeepSpeed JSONs: the accelerate config's deepspeed_config_file {theirs}" in line
    settings = check_launch(TrainConfig(deepspeed_config=theirs))  # the YAML's own file, named again
    assert settings.use_deepspeed and settings.deepspeed_json.own


def test_deepspeed_yaml_keys_next_to_the_json(env, capsys, tmp_path):
    env.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    env.setenv("ACCELERATE_CONFIG_DS_FIELDS", "gradient_accumulation_steps,zero_stage,deepspeed_multinode_launcher")
    line = refused(capsys, tmp_path, "train", "--deepspeed_config", ds_json(tmp_path))
    assert "sets gradient_accumulation_steps, zero_stage next to a DeepSpeed JSON (--deepspeed_config" in line


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "does not exist"),
        ("[1]", "expected a JSON object, got list"),
        ({"train_batch_size": 64}, "needs a zero_optimization section"),
        ({"zero_optimization": {}, "optimizer": {"type": "Lion2"}}, "optimizer type 'Lion2' is neither"),
    ],
)
def test_a_bad_json(env, capsys, tmp_path, content, message):
    path = tmp_path / "ds.json"
    if content is not None:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    line = refused(capsys, tmp_path, "train", "--deepspeed_config", str(path))
    assert message in line, line


def test_cpu_with_a_json_is_refused_where_deepspeed_would_be_dropped(env, capsys, tmp_path):
    from accel_mnist.distributed.accelerator import build_accelerator

    env.setenv("ACCELERATE_USE_CPU", "true")  # exported by hand, as multi_cpu.yaml's header suggests
    assert "Accelerate would silently drop DeepSpeed" in refused(
        capsys, tmp_path, "train", "--deepspeed_config", ds_json(tmp_path)
    )
    env.delenv("ACCELERATE_USE_CPU")
    with pytest.raises(UsageError, match="silently drop DeepSpeed"):
        build_accelerator(TrainConfig(deepspeed_config=ds_json(tmp_path)), cpu=True)


# ----------------------------------------------------------------------------- accepted


def test_the_jsons_accumulation_and_zero3_init(env, tmp_path):
    config = TrainConfig(deepspeed_config=ds_json(tmp_path, gradient_accumulation_steps=4,
                                                  zero_optimization={"stage": 3}))  # fmt: skip
    settings = check_launch(config)
    assert settings.use_deepspeed and settings.grad_accum == 4  # the JSON's number, as from a YAML's file
    assert settings.notes == [] and zero3_init(settings.deepspeed_json) is False  # no effect, no transformers
    env.setenv("ACCELERATE_DEEPSPEED_ZERO3_INIT", "true")
    assert zero3_init(settings.deepspeed_json) is True


def test_one_process_gets_a_process_group_of_its_own(env):
    assert process_group_of_one()
    assert {k: os.environ[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")} == {
        "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}  # fmt: skip
    assert 0 < int(os.environ["MASTER_PORT"]) < 65536
    assert not process_group_of_one()  # a launcher's (or an earlier call's) variables stay


def test_torchrun_variables_are_left_alone(env):
    env.setenv("WORLD_SIZE", "2")
    assert not process_group_of_one() and "LOCAL_RANK" not in os.environ


@pytest.mark.parametrize(
    "fields, line",
    [
        ({"distributed_type": "DEEPSPEED", "zero_stage": 3, "offload_optimizer": "cpu", "offload_param": "none",
          "mixed_precision": "fp16", "num_processes": 2, "device": "cuda"},
         "strategy: DeepSpeed ZeRO-3 (offload optimizer states to cpu); precision: fp16; world size: 2; device: cuda"),
        ({"distributed_type": "MULTI_CPU", "zero_stage": 0, "mixed_precision": "no", "num_processes": 2,
          "device": "cpu", "dynamo_backend": "no"},
         "strategy: DDP (MULTI_CPU); precision: fp32; world size: 2; device: cpu"),
        ({"distributed_type": "NO", "zero_stage": 0, "mixed_precision": "bf16", "num_processes": 1,
          "device": "cuda", "dynamo_backend": "inductor"},
         "strategy: one process, no distribution, torch.compile (inductor); precision: bf16; world size: 1; "
         "device: cuda"),
        ({"distributed_type": "FSDP", "fsdp_version": 2, "zero_stage": 0, "mixed_precision": "bf16",
          "num_processes": 8, "device": "cuda"},
         "strategy: FSDP2; precision: bf16; world size: 8; device: cuda"),
    ],
)  # fmt: skip
def test_strategy_line(fields, line):
    assert Strategy.from_fields(fields).line == line
