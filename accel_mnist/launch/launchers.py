"""Launchers other than `accelerate launch`, and the DeepSpeed JSON a launch asks for.

`accelerate launch` hands its settings to the workers in ACCELERATE_* variables (read in
settings.py). DeepSpeed's own launcher (`deepspeed --num_gpus N --module accel_mnist
train ...`), torchrun and a plain `python -m accel_mnist` hand over only the process-group
variables, so there DeepSpeed runs only when `--deepspeed_config` (TrainConfig.deepspeed_config)
names a JSON, and accel_mnist builds the DeepSpeedPlugin from it. This module finds the JSON
of a launch, wherever it comes from, and refuses a launch that asks for two strategies.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..caller import setting
from ..config import TrainConfig, parse_bool
from ..errors import UsageError
from ..files import read_json_object

# Where an MPI launcher or torchrun says how many processes it started.
MPI_SIZE_VARS = ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE", "WORLD_SIZE")


def env_flag(name: str) -> bool:
    """An ACCELERATE_* boolean as accelerate writes it ('true'/'True'/'1'); unset is False."""
    return parse_bool(os.environ.get(name, "")) is True


@dataclass
class DeepSpeedJson:
    """The DeepSpeed JSON of a launch. `own`: it came from --deepspeed_config, so accel_mnist
    builds the DeepSpeedPlugin; otherwise Accelerate builds it from the accelerate config."""

    path: Path
    data: dict[str, Any]
    own: bool

    @property
    def label(self) -> str:
        return setting("deepspeed_config", self.path) if self.own else f"deepspeed_config_file {self.path}"


def check_local_rank(flag: int | None) -> None:
    """`--local_rank N`, which DeepSpeed's launcher passes to every process, must be the
    LOCAL_RANK that the launcher exported: the process places itself by the variable."""
    if flag is None:
        return
    env = os.environ.get("LOCAL_RANK")
    if env is None:
        raise UsageError(
            f"--local_rank {flag} was given but LOCAL_RANK is not set: start the run with deepspeed or torchrun, "
            "which set it, or leave --local_rank out"
        )
    if env.strip() != str(flag):
        raise UsageError(f"--local_rank {flag} does not match this process's LOCAL_RANK={env}")


def started_by_deepspeed_launcher() -> bool:
    """Whether DeepSpeed's launcher started this process: deepspeed.launcher.launch exports
    these to every worker, next to RANK, LOCAL_RANK and WORLD_SIZE (torchrun does not)."""
    return all(name in os.environ for name in ("CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE"))


WITHOUT_DEEPSPEED = (
    "DeepSpeed's launcher started this run without --deepspeed_config, so it trains without DeepSpeed "
    "({kind}); pass --deepspeed_config ds_config.json for ZeRO"
)


def deepspeed_installed() -> bool:
    """Whether deepspeed can be imported (as Accelerate checks it, without importing it)."""
    from accelerate.utils import is_deepspeed_available

    return bool(is_deepspeed_available())


def deepspeed_json(config: TrainConfig, accelerate_kind: str | None) -> DeepSpeedJson | None:
    """The JSON of this launch: --deepspeed_config, else a DeepSpeed accelerate config's
    deepspeed_config_file; None without either. `accelerate_kind`: under `accelerate launch`,
    the strategy its config asks for (None under any other launcher).

    Raises UsageError, before anything is written, for a JSON that is missing or unreadable,
    for --deepspeed_config without deepspeed installed, and where the accelerate config asks
    for another strategy or another JSON.
    """
    from_yaml = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE", "none")
    yaml_json = Path(from_yaml) if env_flag("ACCELERATE_USE_DEEPSPEED") and from_yaml not in ("", "none") else None
    if config.deepspeed_config is None:
        return _read(DeepSpeedJson(yaml_json, {}, own=False)) if yaml_json is not None else None
    path = Path(config.deepspeed_config)
    if not deepspeed_installed():
        raise UsageError(
            f"{setting('deepspeed_config', path)} asks for DeepSpeed, which is not installed: pip install deepspeed "
            f"(or leave {setting('deepspeed_config')} out to train without it)"
        )
    other = "FSDP" if env_flag("ACCELERATE_USE_FSDP") else None
    if accelerate_kind is not None and not env_flag("ACCELERATE_USE_DEEPSPEED"):
        other = accelerate_kind
    if other is not None:
        raise UsageError(
            f"the accelerate config asks for {other} and {setting('deepspeed_config', path)} for DeepSpeed: give "
            f"the JSON to a DeepSpeed accelerate config (deepspeed_config_file: {path}, as in zero_file.yaml), or "
            "start the run without accelerate launch (deepspeed, torchrun or python -m)"
        )
    found = _read(DeepSpeedJson(path, {}, own=True))
    if yaml_json is not None and not (yaml_json.is_file() and yaml_json.samefile(path)):
        raise UsageError(
            f"two DeepSpeed JSONs: the accelerate config's deepspeed_config_file {yaml_json} and "
            f"{setting('deepspeed_config', path)}; give one of them"
        )
    return found


# What accelerate 1.15 refuses next to a deepspeed_config_file (DeepSpeedPlugin._deepspeed_config_checks).
_FIELDS_ONLY_IN_JSON = (
    "gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
    "offload_param_device", "offload_param_nvme_path", "offload_optimizer_nvme_path", "zero3_save_16bit_model",
    "mixed_precision",
)  # fmt: skip


def check_json_fields(found: DeepSpeedJson) -> None:
    """Refuse in one line the accelerate config fields Accelerate refuses next to the launch's DeepSpeed
    JSON (it raises a ValueError, with a traceback); they belong in the JSON."""
    given = [f for f in os.environ.get("ACCELERATE_CONFIG_DS_FIELDS", "").split(",") if f in _FIELDS_ONLY_IN_JSON]
    if given:
        where = "deepspeed_config_file" if not found.own else f"a DeepSpeed JSON ({found.label})"
        raise UsageError(
            f"the accelerate config sets {', '.join(given)} next to {where}, which Accelerate "
            "refuses; remove them from the YAML and put them in the JSON"
        )


def _read(found: DeepSpeedJson) -> DeepSpeedJson:
    if not found.path.is_file():
        raise UsageError(f"{found.label} does not exist (a relative path is read from {Path.cwd()})")
    found.data = read_json_object(found.path, found.label)
    if "zero_optimization" not in found.data:
        raise UsageError(f"{found.label}: needs a zero_optimization section (Accelerate requires it)")
    return found


def process_group_of_one() -> bool:
    """Export what a launcher exports for one process, where none did (`python -m` with a
    DeepSpeed JSON, a notebook): DeepSpeed needs LOCAL_RANK and a process group even alone,
    and Accelerate then sets it up as `torchrun --nproc_per_node 1` would. Returns whether it did.
    """
    if "LOCAL_RANK" in os.environ or any(os.environ.get(name, "1") != "1" for name in MPI_SIZE_VARS):
        return False
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:  # a free one: two such runs on one machine must not collide
        os.environ["MASTER_PORT"] = str(free_port())
    return True


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now (the OS's choice)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
