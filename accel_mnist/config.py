"""The one typed training config: defaults, validation, and loading from files and flags.

The parallel strategy (DDP, ZeRO stage, offload, mixed precision) is deliberately absent:
it comes from the accelerate config, or from the DeepSpeed JSON that `deepspeed_config` names
(the one way to ask for DeepSpeed under DeepSpeed's own launcher, torchrun, `python -m` or a
notebook), so the same TrainConfig runs everywhere.

A field whose metadata holds `cells` changes how the step or the model runs: the option matrix
(tests/matrix.py) tries each of those values under every strategy and precision.
"""

from __future__ import annotations

import dataclasses
import json
import types
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Union, get_args, get_origin, get_type_hints

from .data.catalog import DATASETS
from .data.placement import DATA_LOADERS
from .errors import ConfigError, one_line
from .models import MODELS, check_mlp_hidden
from .shipped import config_file

OPTIMIZERS = ("adam", "adamw", "sgd", "adadelta")
SCHEDULERS = ("none", "onecycle", "cosine", "step")
LOG_LEVELS = ("debug", "info", "warning", "error")
TRACKERS = ("none", "tensorboard", "wandb", "mlflow", "all")
# `batch_size: auto`, held as 0 until the run replaces it with the batch it chose (memory/plan.py).
AUTO_BATCH = 0


@dataclass
class TrainConfig:
    """Everything a training run needs except the parallel strategy."""

    model: str = field(
        default="cnn",
        metadata={
            "cells": ("linear", "mlp", "lenet5", "bncnn"),
            "help": "linear, mlp, cnn, lenet5, bncnn or bncnn_pool",
        },
    )
    mlp_hidden: str | None = field(
        default=None,
        metadata={
            "cells": ({"model": "mlp", "mlp_hidden": "64,32"},),
            "help": "mlp only: the hidden layers' widths, e.g. 4096,4096,4096 (none: 512,256)",
        },
    )
    dataset: str = field(
        default="mnist", metadata={"help": "mnist, fashion_mnist, kmnist, or hf:NAME_OR_PATH (Hugging Face datasets)"}
    )
    data_dir: str | None = field(
        default=None, metadata={"help": "IDX files; default $ACCEL_MNIST_DATA_DIR, else ./data"}
    )
    download: bool = field(default=True, metadata={"help": "download with torchvision if missing"})
    epochs: int = field(default=1, metadata={"help": "passes over the training set"})
    max_steps: int | None = field(
        default=None, metadata={"help": "stop after this many optimizer steps (overrides epochs)"}
    )
    batch_size: int = field(
        default=64,
        metadata={
            "help": "training batch size per process, or auto: the largest whose predicted peak fits this GPU "
            "under this strategy, chosen before the first step (GPU runs only)"
        },
    )
    max_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "with batch_size auto: the largest batch per process it may take (as Accelerate's "
            "find_executable_batch_size starts from it); unset: as large as fits, up to the whole training split"
        },
    )
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "with batch_size auto: the global batch to keep (batch per process x grad_accum x processes, "
            "DeepSpeed's train_batch_size) on a GPU too small for it in one pass: the largest micro-batch that "
            "fits, and the accumulation that reaches exactly this batch"
        },
    )
    eval_batch_size: int = field(default=1000, metadata={"help": "evaluation batch size per process"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate"})
    optimizer: str = field(
        default="adam", metadata={"cells": ("adamw", "sgd", "adadelta"), "help": ", ".join(OPTIMIZERS)}
    )
    momentum: float = field(default=0.9, metadata={"help": "momentum for sgd"})
    label_smoothing: float = field(
        default=0.0,
        metadata={
            "cells": (0.1,),
            "help": "the training loss's label smoothing in [0, 1) (torch's cross_entropy); evaluation's loss has none",
        },
    )
    ema_decay: float | None = field(
        default=None,
        metadata={
            "cells": (0.9,),
            "help": "evaluate, checkpoint and export an exponential moving average of the parameters with this "
            "decay in (0, 1), e.g. 0.95 (none: the parameters as trained; training/averaging.py)",
        },
    )
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    scheduler: str = field(
        default="none", metadata={"cells": ("onecycle", "cosine", "step"), "help": ", ".join(SCHEDULERS)}
    )
    cycle_momentum: bool = field(
        default=True,
        metadata={
            "cells": ({"scheduler": "onecycle", "cycle_momentum": False},),
            "help": "onecycle: also cycle Adam's beta1 (SGD's momentum) against the learning rate, as torch's "
            "OneCycleLR does; cuda_graph needs false (a captured step keeps the beta1 it was captured with)",
        },
    )
    step_gamma: float = field(default=0.7, metadata={"help": "lr factor per epoch for 'step'"})
    grad_accum: int | None = field(
        default=None,
        metadata={
            "cells": (2,),
            "help": "micro-batches per optimizer step (unset: the launcher's --gradient_accumulation_steps, else 1)",
        },
    )
    max_grad_norm: float | None = field(
        default=None, metadata={"cells": (1.0,), "help": "clip gradients to this norm (none: no clipping)"}
    )
    deepspeed_config: str | None = field(
        default=None,
        metadata={
            "help": "a DeepSpeed JSON (ds_config.json): train under DeepSpeed with its ZeRO stage, precision and "
            "offload, whatever the launcher (also spelt --deepspeed_config, as DeepSpeed's own scripts do)"
        },
    )
    seed: int = field(default=42, metadata={"help": "seed for weights and data order"})
    stop_at_accuracy: float | None = field(
        default=None, metadata={"help": "stop once an evaluation reaches this test accuracy (e.g. 0.99)"}
    )
    eval_every: int = field(default=0, metadata={"help": "evaluate every N optimizer steps (0: at each epoch end)"})
    log_every: int = field(default=50, metadata={"help": "progress-bar refresh, in optimizer steps"})
    num_workers: int = field(
        default=0,
        metadata={"cells": ({"data_loader": "torch", "num_workers": 1},), "help": "DataLoader worker processes"},
    )
    output_dir: str = field(default="outputs/run", metadata={"help": "where results are written"})
    overwrite: bool = field(default=False, metadata={"help": "replace the results of a finished run in output_dir"})
    quiet: bool = field(
        default=False,
        metadata={"help": "no progress bar, even on a terminal (the one line per evaluation still prints)"},
    )
    log_level: str = field(default="info", metadata={"help": "debug, info, warning or error"})
    report_to: str = field(
        default="none",
        metadata={"cells": ("tensorboard",), "help": "experiment tracker: tensorboard, wandb, mlflow, all or none"},
    )
    data_loader: str = field(
        default="auto",
        metadata={
            "cells": ("device", "torch"),
            "help": "auto (whole dataset on the device), device, or torch (DataLoader)",
        },
    )
    cudnn_benchmark: bool = field(
        default=False,
        metadata={
            "cells": (True,),
            "help": "let cuDNN time and pick convolution algorithms (GPU; slower for short runs, see benchmarks)",
        },
    )
    channels_last: bool = field(
        default=False,
        metadata={
            "cells": (True,),
            "help": "convolution weights and inputs in channels-last memory format (faster cuDNN kernels)",
        },
    )
    cuda_graph: bool = field(
        default=False,
        metadata={
            "cells": (True,),
            "help": "capture the training step once as a CUDA graph and replay it (one GPU process or DDP, "
            "Adam or AdamW, no clipping, no fp16; elsewhere the eager step runs and a line says why)",
        },
    )
    prewarm: bool = field(
        default=False,
        metadata={
            "cells": (True,),
            "help": "before the training clock starts, run one untimed step on a copy of the model "
            "(GPU kernel loading; under DeepSpeed also on a throwaway engine; reported as prewarm_seconds, the weights "
            "are unchanged)",
        },
    )
    compile_evaluation: bool = field(
        default=True,
        metadata={
            "cells": (False,),
            "help": "where the launch compiles the model (dynamo_backend), evaluate with it compiled; false: with its "
            "eager kernels, no evaluation graph to compile (seconds a command that a short run's few evaluations "
            "do not repay: see accelerate_configs/README.md, torch dynamo)",
        },
    )
    checkpoint_every: int = field(
        default=0, metadata={"help": "also checkpoint every N optimizer steps (0: only at epoch ends)"}
    )
    profile: int = field(
        default=0,
        metadata={
            "help": "record N optimizer steps after the first with torch's profiler (Accelerate's ProfileKwargs), "
            "the first N that no evaluation or checkpoint interrupts: a trace per process in <output-dir>/profile/, "
            "the top operations, kernels and microseconds per step printed and kept in results.json (0: off)"
        },
    )
    save_checkpoints: bool = field(default=True, metadata={"help": "write checkpoints at all"})
    keep_checkpoints: int = field(default=2, metadata={"help": "how many recent checkpoints to keep"})
    resume_from: str | None = field(
        default=None,
        metadata={
            "help": "'auto' (latest checkpoint of output_dir if any, else a fresh start; a finished run "
            "is returned as it is), 'latest' (must exist) or a checkpoint folder"
        },
    )
    trust_checkpoint: bool = field(
        default=False, metadata={"help": "let the resumed checkpoint unpickle any object (only for ones you made)"}
    )
    max_nonfinite: int = field(
        default=10, metadata={"help": "stop after this many optimizer steps in a row with a non-finite loss"}
    )
    export: bool = field(default=True, metadata={"help": "write model.safetensors at the end"})
    plots: bool = field(
        default=True,
        metadata={
            "help": "draw training_curves.png and confusion_matrix.png at the end (or later: accel-mnist report)"
        },
    )

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first key whose value cannot work."""
        _choice("model", self.model, tuple(MODELS))
        if self.mlp_hidden is not None:
            check_mlp_hidden(self.model, self.mlp_hidden)
        if not (self.dataset.startswith("hf:") and len(self.dataset) > 3):
            _choice("dataset", self.dataset, (*DATASETS, "hf:NAME_OR_PATH"))
        _choice("optimizer", self.optimizer, OPTIMIZERS)
        _choice("scheduler", self.scheduler, SCHEDULERS)
        if self.batch_size == "auto":  # TrainConfig(batch_size="auto") from Python, as a flag or a file says it
            self.batch_size = AUTO_BATCH
        if self.batch_size != AUTO_BATCH:
            _at_least("batch_size", self.batch_size, 1)
        if self.max_batch_size is not None:
            _at_least("max_batch_size", self.max_batch_size, 1)
            if self.batch_size != AUTO_BATCH:
                raise ConfigError(f"max_batch_size: bounds batch_size auto, but batch_size is {self.batch_size}; "
                                  "give batch_size auto or leave max_batch_size out")  # fmt: skip
        if self.global_batch_size is not None:
            _at_least("global_batch_size", self.global_batch_size, 1)
            if self.batch_size != AUTO_BATCH:
                raise ConfigError(f"global_batch_size: is kept by batch_size auto, but batch_size is "
                                  f"{self.batch_size}; give batch_size auto, or grad_accum with your own "
                                  "batch")  # fmt: skip
            if self.grad_accum is not None and self.grad_accum > 1:
                raise ConfigError(f"global_batch_size: chooses the accumulation, but grad_accum is {self.grad_accum}; "
                                  "leave one of them out")  # fmt: skip
        for key in ("epochs", "eval_batch_size", "log_every"):
            _at_least(key, getattr(self, key), 1)
        if self.grad_accum is not None:
            _at_least("grad_accum", self.grad_accum, 1)
        _choice("log_level", self.log_level, LOG_LEVELS)
        _choice("report_to", self.report_to, TRACKERS)
        _choice("data_loader", self.data_loader, DATA_LOADERS)
        _at_least("keep_checkpoints", self.keep_checkpoints, 1)
        _at_least("max_nonfinite", self.max_nonfinite, 1)
        for key in ("eval_every", "num_workers", "checkpoint_every", "profile"):
            _at_least(key, getattr(self, key), 0)
        if self.max_steps is not None:
            _at_least("max_steps", self.max_steps, 1)
        if not self.lr > 0:
            raise ConfigError(f"lr: must be > 0, got {self.lr}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing: must be in [0, 1), got {self.label_smoothing}")
        if self.ema_decay is not None and not 0.0 < self.ema_decay < 1.0:
            raise ConfigError(f"ema_decay: must be in (0, 1) (or null for none), got {self.ema_decay}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise ConfigError(f"max_grad_norm: must be > 0 (or null for no clipping), got {self.max_grad_norm}")
        for key in ("weight_decay", "momentum"):
            if getattr(self, key) < 0:
                raise ConfigError(f"{key}: must be >= 0, got {getattr(self, key)}")
        if not 0 < self.step_gamma <= 1:
            raise ConfigError(f"step_gamma: must be in (0, 1], got {self.step_gamma}")
        if self.stop_at_accuracy is not None and not 0 < self.stop_at_accuracy <= 1:
            raise ConfigError(f"stop_at_accuracy: must be in (0, 1], got {self.stop_at_accuracy}")
        if not self.output_dir:
            raise ConfigError("output_dir: must not be empty")
        if self.deepspeed_config is not None and not self.deepspeed_config.strip():
            raise ConfigError("deepspeed_config: must not be empty (null for no DeepSpeed JSON)")

    def to_dict(self) -> dict[str, Any]:
        """Plain values, as saved in config.json and checkpoints."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], source: str = "config") -> TrainConfig:
        """Build from a mapping, rejecting unknown keys and values of the wrong type."""
        if not isinstance(values, dict):
            raise ConfigError(f"{source}: expected a mapping of keys to values, got {type(values).__name__}")
        hints = get_type_hints(cls)
        known = {f.name for f in fields(cls)}
        kwargs = {}
        for key, value in values.items():
            name = str(key).replace("-", "_")
            if name not in known:
                raise ConfigError(f"{source}: unknown key '{key}' (valid keys: {', '.join(sorted(known))})")
            kwargs[name] = coerce(name, value, hints[name])
        return cls(**kwargs)

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with `changes` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def load_config_file(path: str | Path) -> dict[str, Any]:
    """Read a YAML or JSON config file, or a shipped recipe by the name `accel-mnist configs` lists
    (`fast99`; a file of that name wins), into a plain dict (keys are checked later)."""
    file = config_file(path)
    suffix = Path(file.name).suffix
    import yaml

    try:
        text = file.read_text(encoding="utf-8")
        # safe_load: a config file from elsewhere must never construct Python objects.
        data = json.loads(text) if suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError, UnicodeDecodeError) as e:
        kind = "JSON" if suffix == ".json" else "YAML"
        raise ConfigError(f"{path}: not valid {kind}: {one_line(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys to values, got {type(data).__name__}")
    return data


# The spellings Accelerate's own str_to_bool accepts, so that a flag, a config file and an
# ACCELERATE_* variable written by `accelerate launch` all read alike.
_TRUE = ("y", "yes", "t", "true", "on", "1")
_FALSE = ("n", "no", "f", "false", "off", "0")


def parse_bool(text: str) -> bool | None:
    """True or False for a boolean's spellings (any case, surrounding space ignored); None otherwise."""
    word = text.strip().lower()
    return True if word in _TRUE else False if word in _FALSE else None


def coerce(name: str, value: Any, hint: Any) -> Any:
    """Convert `value` (from YAML, JSON or a command-line string) to the field's type."""
    origin, args = get_origin(hint), get_args(hint)
    optional = origin in (Union, types.UnionType) and type(None) in args
    base = next(a for a in args if a is not type(None)) if optional else hint
    if value is None or (optional and isinstance(value, str) and value.lower() in ("none", "null")):
        if optional:
            return None
        raise ConfigError(f"{name}: must not be null")
    if name.lstrip("-").replace("-", "_") == "batch_size":  # a number, or "auto" (TrainConfig makes it AUTO_BATCH)
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        if not isinstance(value, bool) and value in (0, "0"):  # 0 stands for auto inside
            raise ConfigError(f"{name}: must be >= 1 or auto, got 0")
    try:
        if base is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and (parsed := parse_bool(value)) is not None:
                return parsed
            raise ValueError
        if base is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if base is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if base is str:
            if not isinstance(value, (str, int, float)) or isinstance(value, bool):
                raise ValueError
            return str(value)
    except (TypeError, ValueError):
        pass
    else:
        return value
    raise ConfigError(f"{name}: expected {base.__name__}, got {value!r}")


def _choice(key: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{key}: '{value}' is not one of {', '.join(choices)}")


def _at_least(key: str, value: int, low: int) -> None:
    if value < low:
        raise ConfigError(f"{key}: must be >= {low}, got {value}")
