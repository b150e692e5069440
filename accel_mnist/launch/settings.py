"""What `accelerate launch` and the accelerate config asked for, checked before any work.

Some settings never reach the training process in a form Accelerate acts on: outside DeepSpeed
`accelerate launch --gradient_accumulation_steps N` is not exported at all, and the wizard's
MULTI_CPU answer starts one process where it promised several. This module reads what the
launcher was told (its environment, and its own command line parsed by accelerate's parser),
so that every such setting is either honoured or refused with one line, before the output
directory is touched.
"""

from __future__ import annotations

import argparse
import copy
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import TrainConfig, parse_bool
from ..errors import ConfigError, UsageError
from ..optim import schedule_refusal
from .launchers import MPI_SIZE_VARS, DeepSpeedJson, check_json_fields, deepspeed_json, env_flag
from .optim_sections import check_deepspeed_optim

_FP8_BACKENDS = ("torchao", "transformer_engine", "msamp")
# Accelerate would quietly train without one of the two: `--cpu` starts one plain process (no
# DeepSpeed, no FSDP), and DeepSpeed's and FSDP's launchers never pass `use_cpu` on.
_CPU_ASKED = "together with the CPU (--cpu, use_cpu: true or ACCELERATE_USE_CPU)"
_LEAVE_OUT = "leave out --cpu / use_cpu / ACCELERATE_USE_CPU"
DEEPSPEED_WITH_CPU = (
    f"DeepSpeed was requested {_CPU_ASKED}, and Accelerate would silently drop DeepSpeed or the CPU; "
    f"{_LEAVE_OUT} (DeepSpeed runs on CPU when no GPU is present)"
)
FSDP_WITH_CPU = (
    f"FSDP was requested {_CPU_ASKED}, and Accelerate would silently drop FSDP or the CPU; {_LEAVE_OUT} "
    "(FSDP needs a GPU)"
)


@dataclass
class LaunchSettings:
    """The launcher's settings that matter to the loop, and what to tell the user about them."""

    grad_accum: int
    use_deepspeed: bool = False
    # The DeepSpeed JSON of the launch (from --deepspeed_config or the accelerate config), checked.
    deepspeed_json: DeepSpeedJson | None = None
    notes: list[str] = field(default_factory=list)  # one warning each, printed once by the main process


def check_launch(config: TrainConfig, *, cpu: bool = False) -> LaunchSettings:
    """Refuse what the loop cannot honour, and resolve the accumulation (`grad_accum` of the settings returned;
    the config is left as given).
    `cpu`: the script asks for `Accelerator(cpu=True)`.

    Runs in every process before the Accelerator exists, so nothing has been written yet.
    """
    launcher = launcher_args()
    found = deepspeed_json(config, _accelerate_kind(launcher))
    ds_json = found.data if found is not None else None
    use_deepspeed = env_flag("ACCELERATE_USE_DEEPSPEED") or found is not None
    _check_cpu(launcher, use_deepspeed, cpu)
    if env_flag("ACCELERATE_USE_MEGATRON_LM"):
        raise UsageError("Megatron-LM (distributed_type: MEGATRON_LM) is not supported; use a DDP or DeepSpeed config")
    _check_process_count(launcher)
    _check_fp8()
    if found is not None:
        check_json_fields(found)
    if ds_json is not None:
        # The same check runs again on Accelerate's copy (strategy._align_deepspeed); here it only
        # refuses early a JSON optimizer/scheduler that DeepSpeed would reject mid-setup.
        check_deepspeed_optim(copy.deepcopy(ds_json), config)
    grad_accum, note = _resolve_grad_accum(config, launcher, ds_json, use_deepspeed)
    settings = LaunchSettings(grad_accum, use_deepspeed, found, notes=[note] if note else [])
    if launcher is not None and not use_deepspeed and launcher.gradient_clipping is not None:
        settings.notes.append(
            f"accelerate launch --gradient_clipping {launcher.gradient_clipping} only applies to DeepSpeed, and "
            f"accelerate drops it here; clipping comes from the training config (--max-grad-norm, now "
            f"{config.max_grad_norm})"
        )
    if use_deepspeed and zero3_init(found):
        from accelerate.utils import is_transformers_available

        if not is_transformers_available():  # Accelerate raises a bare Exception for this
            raise UsageError(
                "zero3_init_flag is on (the default for ZeRO-3 when the YAML leaves it out), which Accelerate only "
                "allows with transformers installed, and it has no effect on accel_mnist's models; set "
                "zero3_init_flag: false in the accelerate config"
            )
        settings.notes.append(
            "zero3_init_flag has no effect here: Accelerate applies deepspeed.zero.Init only to Transformers "
            "models; ZeRO-3 partitions this model's parameters when it is prepared"
        )
    # The config's optimizer and schedule are built unless a DeepSpeed JSON brings its own optimizer.
    if not (ds_json and "optimizer" in ds_json) and (why := schedule_refusal(config)):
        raise UsageError(why)
    return settings


def zero3_init(found: DeepSpeedJson | None) -> bool:
    """Whether the DeepSpeedPlugin will turn zero3_init_flag on: as the accelerate config asks,
    else on for ZeRO-3 where Accelerate builds the plugin, off where accel_mnist does."""
    asked = os.environ.get("ACCELERATE_DEEPSPEED_ZERO3_INIT")
    if asked is not None:
        return parse_bool(asked) is True
    if found is not None and found.own:
        return False  # no effect on these models (see check_launch), and no transformers needed
    ds_json = found.data if found is not None else None
    stage = ds_json.get("zero_optimization", {}).get("stage") if ds_json else None
    if stage is None:
        stage = os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE", "2")
    return str(stage) == "3"


def _resolve_grad_accum(
    config: TrainConfig, launcher: argparse.Namespace | None, ds_json: dict[str, Any] | None, use_deepspeed: bool
) -> tuple[int, str | None]:
    """The training config's grad_accum when set, else the launcher's, else 1; and a note when they differ."""
    asked: tuple[int, str] | None = None
    json_value = (ds_json or {}).get("gradient_accumulation_steps")
    env_value = os.environ.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "").strip()
    if isinstance(json_value, int) and not isinstance(json_value, bool):
        # Accelerate keeps a JSON's own number over the launcher's (it fills only "auto").
        asked = (json_value, "the DeepSpeed JSON's gradient_accumulation_steps")
    elif env_value:
        if not env_value.isdigit() or int(env_value) < 1:
            raise ConfigError(f"ACCELERATE_GRADIENT_ACCUMULATION_STEPS: must be an integer >= 1, got {env_value!r}")
        source = "the accelerate config's gradient_accumulation_steps" if use_deepspeed else ""
        asked = (int(env_value), source or "ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    elif launcher is not None and launcher.gradient_accumulation_steps is not None:
        # Outside DeepSpeed, accelerate launch parses this flag and then drops it.
        asked = (int(launcher.gradient_accumulation_steps), "accelerate launch --gradient_accumulation_steps")
    if asked is not None and asked[0] < 1:
        raise ConfigError(f"{asked[1]}: must be >= 1, got {asked[0]}")
    if config.global_batch_size is not None and asked is not None and asked[0] > 1:
        raise ConfigError(f"global_batch_size: chooses the accumulation, but {asked[1]} is {asked[0]}; "
                          "leave one of them out")  # fmt: skip
    if config.grad_accum is None:
        return (asked[0] if asked else 1), None
    if asked is not None and asked[0] != config.grad_accum:
        return config.grad_accum, (
            f"{asked[1]} is {asked[0]}, the training config's grad_accum is {config.grad_accum}: "
            f"using grad_accum={config.grad_accum} (leave --grad-accum unset to use the launcher's)"
        )
    return config.grad_accum, None


def _check_process_count(launcher: argparse.Namespace | None) -> None:
    """Stop when the accelerate config asked for several processes but only this one runs."""
    started = next((int(os.environ[v]) for v in MPI_SIZE_VARS if os.environ.get(v, "").isdigit()), 1)
    if launcher is None or started > 1:
        return
    cfg = _accelerate_config(launcher)
    wanted = launcher.num_processes if launcher.num_processes is not None else getattr(cfg, "num_processes", None)
    machines = launcher.num_machines if launcher.num_machines is not None else getattr(cfg, "num_machines", 1)
    if not wanted or int(wanted) <= 1 or (machines or 1) > 1:
        return
    kind = getattr(getattr(cfg, "distributed_type", None), "value", "NO") if cfg is not None else "NO"
    if launcher.multi_gpu or launcher.use_deepspeed or kind not in ("NO", "MULTI_CPU"):
        return  # torchrun/deepspeed would have started them; WORLD_SIZE would say so
    raise UsageError(
        f"the accelerate config asks for {wanted} processes (distributed_type: {kind}) but accelerate launch "
        "started only this one: without an mpirun hostfile it runs the script once. For several CPU processes "
        "use --config_file accelerate_configs/multi_cpu.yaml, or set mpirun_config.mpirun_hostfile (mpirun)"
    )


def _check_cpu(launcher: argparse.Namespace | None, use_deepspeed: bool, cpu: bool) -> None:
    """Refuse DeepSpeed or FSDP asked for together with the CPU, however each was asked for.

    The workers' environment alone cannot tell (accelerate 1.8 to 1.16, `launch_command`): with
    `--cpu`, `accelerate launch` runs its simple launcher, which exports ACCELERATE_USE_CPU but
    nothing of DeepSpeed or FSDP, and DeepSpeed's and FSDP's launchers never export `use_cpu`.
    So the launcher's own command line and config file are read too.
    """
    asked = _launcher_strategy(launcher) if launcher is not None else None
    if launcher is not None and (launcher.cpu or getattr(_accelerate_config(launcher), "use_cpu", False)):
        cpu = True
    if not (cpu or env_flag("ACCELERATE_USE_CPU")):
        return
    if use_deepspeed or asked == "DEEPSPEED":
        raise UsageError(DEEPSPEED_WITH_CPU)
    if env_flag("ACCELERATE_USE_FSDP") or asked == "FSDP":
        raise UsageError(FSDP_WITH_CPU)


def _check_fp8() -> None:
    if os.environ.get("ACCELERATE_MIXED_PRECISION", "").lower() != "fp8":
        return
    from accelerate.utils import is_fp8_available

    if not is_fp8_available():
        raise UsageError(
            f"mixed precision fp8 needs one of {', '.join(_FP8_BACKENDS)} installed, and none is; "
            "install one (e.g. pip install torchao) or launch with --mixed_precision bf16"
        )
    import torch

    if not torch.cuda.is_available():
        raise UsageError("mixed precision fp8 needs a GPU (compute capability 8.9+); on CPU use --mixed_precision no")


def _accelerate_kind(launcher: argparse.Namespace | None) -> str | None:
    """Under `accelerate launch`, the strategy its flags and config ask for (for messages); else None."""
    if launcher is None:
        return None
    if launcher.cpu or env_flag("ACCELERATE_USE_CPU"):
        return "the CPU alone (--cpu / use_cpu, with which Accelerate drops DeepSpeed)"
    return _launcher_strategy(launcher) or "NO (one process)"


# accelerate launch's strategy flags: any of them, and it leaves the config file's distributed_type unread.
_STRATEGY_FLAGS = (("use_deepspeed", "DEEPSPEED"), ("use_fsdp", "FSDP"), ("multi_gpu", "MULTI_GPU"),
                   ("use_megatron_lm", "MEGATRON_LM"), ("tpu", "XLA"))  # fmt: skip


def _launcher_strategy(launcher: argparse.Namespace) -> str | None:
    """The distributed_type that an `accelerate launch` command line asks for, before `--cpu` or
    `use_cpu` has its say: a strategy flag, else the config file's; None without either."""
    for flag, kind in _STRATEGY_FLAGS:
        if getattr(launcher, flag, False):
            return kind
    written = getattr(getattr(_accelerate_config(launcher), "distributed_type", None), "value", None)
    return str(written) if written else None


def _accelerate_config(launcher: argparse.Namespace) -> Any:
    """The accelerate config file the launcher read (None if there is none or it cannot be read)."""
    from accelerate.commands.config.config_args import default_config_file, load_config_from_file

    name = launcher.config_file
    # As accelerate does (_validate_launch_command), `--cpu` leaves the default config file unread.
    if name is None and (launcher.cpu or not os.path.isfile(default_config_file)):
        return None
    if name is not None and not os.path.isabs(name):
        name = str(Path(getattr(launcher, "_cwd", ".")) / name)
    try:
        return load_config_from_file(name)
    except (OSError, ValueError, TypeError):
        return None


def launcher_args() -> argparse.Namespace | None:
    """The `accelerate launch` command line that started this process, parsed by accelerate's own
    parser; None when not started by `accelerate launch` or where /proc cannot tell (not Linux)."""
    found = _launcher_argv()
    if found is None:
        return None
    argv, cwd = found
    from accelerate.commands.launch import launch_command_parser

    try:
        args, _ = launch_command_parser().parse_known_args(argv)
    except SystemExit:  # argparse's way of failing: the launcher itself would have refused this
        return None
    args._cwd = cwd
    return args


def _launcher_argv() -> tuple[list[str], str] | None:
    """The arguments after `accelerate launch` of the nearest ancestor process that ran it."""
    if "ACCELERATE_MIXED_PRECISION" not in os.environ:  # every accelerate launcher exports it
        return None
    pid = os.getppid()
    for _ in range(4):  # the launcher is the parent (simple launcher, torchrun's in-process agent) or close
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            return None
        words = [a.decode(errors="replace") for a in argv if a]
        for i, word in enumerate(words):
            base = os.path.basename(word)
            if base == "accelerate" and words[i + 1 : i + 2] == ["launch"]:
                return words[i + 2 :], cwd
            if base == "accelerate-launch" or (word == "accelerate.commands.launch" and words[i - 1 : i] == ["-m"]):
                return words[i + 1 :], cwd
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid <= 1:
            return None
    return None
