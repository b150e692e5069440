"""FSDP (1 and 2) and torch dynamo through the accelerate config: the checks, in process.

What was measured with accelerate 1.15 and torch 2.14 on a machine without a GPU: with
`--use_fsdp` Accelerate sets up DDP (cpu=True: MULTI_CPU) or one world per process (NO), never
FSDP, and FSDP1 itself raises "FSDP needs a non-CPU accelerator device". Training under FSDP is
therefore tested on GPUs (tests/gpu/test_fsdp.py); here, that it is refused, the checks a
strategy passes, and FSDP checkpoint files that are refused.
"""

from __future__ import annotations

import os
import types
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from accelerate.utils import DistributedType, is_cuda_available

from accel_mnist import TrainConfig
from accel_mnist.distributed.accelerator import build_accelerator
from accel_mnist.distributed.prepare import prepare
from accel_mnist.distributed.strategy import Strategy
from accel_mnist.distributed.strategy_checks import check_strategy
from accel_mnist.errors import UsageError
from accel_mnist.run.checkpoint_weights import FSDP_FULL, FSDP_SHARDED, checkpoint_weights
from tests.helpers import CONFIGS, REPO

no_gpu_only = pytest.mark.skipif(is_cuda_available(), reason="about machines without a GPU")


@no_gpu_only
def test_fsdp_without_a_gpu_is_refused_before_the_accelerator(tmp_path, monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    with pytest.raises(UsageError, match="FSDP needs a GPU"):
        build_accelerator(TrainConfig(output_dir=str(tmp_path / "run")))
    assert not (tmp_path / "run").exists()


def test_world_size_that_accelerate_did_not_join_is_refused():
    # What a launch onto a device without a collective backend would otherwise give: N runs of one.
    alone = SimpleNamespace(
        num_processes=1, distributed_type=DistributedType.NO, device=torch.device("cpu"), mixed_precision="no",
        state=SimpleNamespace(dynamo_plugin=SimpleNamespace(backend=SimpleNamespace(value="NO"))),
    )  # fmt: skip
    check_strategy(alone, use_fsdp=False, world_size=1)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="started 2 processes but Accelerate joined 1"):
        check_strategy(alone, use_fsdp=False, world_size=2)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="FSDP was requested"):
        check_strategy(alone, use_fsdp=True, world_size=1)  # type: ignore[arg-type]


def _fsdp_state(version: int, use_orig_params: bool | None, backend: str) -> SimpleNamespace:
    fsdp = SimpleNamespace(fsdp_version=version, use_orig_params=use_orig_params)
    dynamo = SimpleNamespace(backend=SimpleNamespace(value=backend))
    state = SimpleNamespace(fsdp_plugin=fsdp, dynamo_plugin=dynamo)
    return SimpleNamespace(num_processes=1, distributed_type=DistributedType.FSDP, device=torch.device("cuda"),
                           mixed_precision="no", state=state)  # fmt: skip


def test_dynamo_with_fsdp1_needs_the_original_parameters():
    check_strategy(_fsdp_state(1, True, "INDUCTOR"), use_fsdp=True, world_size=1)  # type: ignore[arg-type]
    check_strategy(_fsdp_state(1, False, "NO"), use_fsdp=True, world_size=1)  # type: ignore[arg-type]
    check_strategy(_fsdp_state(2, None, "INDUCTOR"), use_fsdp=True, world_size=1)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="fsdp_use_orig_params: true"):
        check_strategy(_fsdp_state(1, False, "INDUCTOR"), use_fsdp=True, world_size=1)  # type: ignore[arg-type]


class _Wrapped(torch.nn.Module):
    """Stands in for FSDP1 with use_orig_params false: new parameters replace the module's."""

    def __init__(self, module: torch.nn.Module):
        super().__init__()
        self.flat = torch.nn.Parameter(torch.cat([p.detach().flatten() for p in module.parameters()]))


class _RecordingAccelerator:
    def __init__(self, is_fsdp2: bool):
        self.distributed_type, self.is_fsdp2, self.calls = DistributedType.FSDP, is_fsdp2, []
        self.state, self.mixed_precision = types.SimpleNamespace(deepspeed_plugin=None), "no"

    def prepare(self, *objs):
        self.calls.append([type(o).__name__ for o in objs])
        out = tuple(_Wrapped(o) if isinstance(o, torch.nn.Module) else o for o in objs)
        return out[0] if len(out) == 1 else out


@pytest.mark.parametrize("is_fsdp2", [False, True])
def test_prepare_builds_the_optimizer_in_the_order_fsdp_needs(is_fsdp2):
    accelerator = _RecordingAccelerator(is_fsdp2)
    strategy = Strategy(kind="FSDP", device="cuda", fsdp_version=2 if is_fsdp2 else 1)
    model, optimizer, _ = prepare(accelerator, TrainConfig(), torch.nn.Linear(3, 2), 10, 5, strategy)  # type: ignore[arg-type]
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    if is_fsdp2:  # one call: Accelerate maps the optimizer onto fully_shard's parameters itself
        assert accelerator.calls == [["Linear", "Adam", "LambdaLR"]]
    else:  # FSDP1: wrap first, then build the optimizer on what the wrapper trains
        assert accelerator.calls == [["Linear"], ["Adam", "LambdaLR"]]
        assert stepped == [model.flat]


def test_fsdp_full_file_with_foreign_objects_is_refused(tmp_path):
    torch.save({"net.0.weight": torch.zeros(2), "why": Path("x")}, tmp_path / FSDP_FULL)
    with pytest.raises(UsageError, match="holds objects other than tensors"):
        checkpoint_weights(tmp_path)


def test_incomplete_fsdp_sharded_checkpoint_is_one_line(tmp_path):
    (tmp_path / FSDP_SHARDED).mkdir()
    (tmp_path / FSDP_SHARDED / ".metadata").write_bytes(b"")
    with pytest.raises(UsageError, match="incomplete FSDP checkpoint"):
        checkpoint_weights(tmp_path)


def test_deepspeed_launcher_drops_the_dynamo_answer(monkeypatch):
    """Pins accelerate 1.15: its DeepSpeed launcher exports no ACCELERATE_DYNAMO_BACKEND (the multi-GPU
    one does), so the workers cannot know about `--dynamo_backend`/`dynamo_config`; the README says
    to export ACCELERATE_DYNAMO_BACKEND instead. If this fails, accelerate now passes it on."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    for key in list(os.environ):
        if key.startswith("ACCELERATE_"):
            monkeypatch.delenv(key)
    monkeypatch.chdir(REPO)
    for config, prepare_env in (("zero2.yaml", prepare_deepspeed_cmd_env), ("multi_gpu.yaml", prepare_multi_gpu_env)):
        argv = ["--config_file", str(CONFIGS / config), "--dynamo_backend", "inductor", "script.py"]
        args, defaults, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
        args.deepspeed_fields_from_accelerate_config = list(defaults.deepspeed_config)  # as launch_command sets it
        args.main_process_port = 0
        env = prepare_env(args)
        env = env[1] if isinstance(env, tuple) else env
        assert env.get("ACCELERATE_DYNAMO_BACKEND") == (None if config == "zero2.yaml" else "INDUCTOR"), config
