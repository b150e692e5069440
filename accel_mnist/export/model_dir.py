"""Exported models: full fp32 weights in safetensors plus a small JSON config.

An export is a directory holding `model.safetensors` and `model_config.json`. It is made from
a live run (`full_state_dict` + `save_exported`) or from a checkpoint that
`accelerator.save_state` wrote (`export_from_checkpoint`), under any strategy, and it loads
with `load_model` in a plain process: no Accelerate, no DeepSpeed, and no pickle.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import UsageError, one_line
from ..files import fsync_file, json_bytes, read_json_object, writing
from ..run.checkpoint import STATE_FILE
from ..run.checkpoint_weights import checkpoint_weights, read_safetensors

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "model_config.json"
FORMAT_VERSION = 1


def full_state_dict(accelerator: Any, model: nn.Module) -> dict[str, torch.Tensor]:
    """A snapshot of the full fp32 CPU weights of a prepared model, keyed as the user's module.

    Call it on every process: under ZeRO-3 it gathers the shards, a collective operation.
    """
    from accelerate.utils import DistributedType

    module = _unwrapped(accelerator, model)
    if getattr(accelerator.state, "deepspeed_plugin", None) is not None:
        return _deepspeed_state_dict(module)
    if accelerator.distributed_type == DistributedType.FSDP:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        # torch's gathering, as accelerator.get_state_dict does it for FSDP2; its FSDP1 branch
        # always offloads to the CPU, which FSDP1 refuses in one process (world size 1 turns
        # FULL_SHARD into NO_SHARD: "offload_to_cpu=True and NO_SHARD is not supported yet").
        # Offloaded (several processes), the full dict lands on the main process only and the
        # others get an empty one. Under dynamo, FSDP2 wraps the compiled module ("_orig_mod.").
        options = StateDictOptions(full_state_dict=True, cpu_offload=accelerator.num_processes > 1)
        return _fp32_cpu(_strip_wrapper_prefixes(get_model_state_dict(model, options=options)))
    return _fp32_cpu(module.state_dict())


def export_prepared(
    accelerator: Any, model: nn.Module, out_dir: Path, model_name: str, dataset: str, extra: dict[str, Any]
) -> None:
    """Export a prepared model (call on every process): gathered where sharded, written by the
    main process; a write the storage refuses there stops every process with the same error."""
    from ..distributed.consensus import agree

    weights = full_state_dict(accelerator, model)
    write = lambda: save_exported(weights, out_dir, model_name=model_name, dataset=dataset, extra=extra)  # noqa: E731
    agree(accelerator, lambda: write() if accelerator.is_main_process else None)


def _unwrapped(accelerator: Any, model: nn.Module) -> nn.Module:
    """What accelerator.unwrap_model(model, keep_torch_compile=False) gives, without its cost
    where the wrapper is known: accelerate 1.15 imports deepspeed on every unwrap where it is
    installed, to test for its engine (the export phase of benchmarks/results/h200-2026-12-01b)."""
    from accelerate.utils import DistributedType, is_compiled_module

    if not is_compiled_module(model):
        if isinstance(model, torch.nn.parallel.DistributedDataParallel):
            return model.module
        if accelerator.distributed_type == DistributedType.NO:
            return model  # Accelerate moved it and may have wrapped its forward, nothing else
    return accelerator.unwrap_model(model, keep_torch_compile=False)


def _deepspeed_state_dict(module: nn.Module) -> dict[str, torch.Tensor]:
    # Under fp16/bf16 the module's parameters are half precision; the fp32 master weights live,
    # partitioned, in the ZeRO optimizer. safe_get_full_fp32_param assembles one parameter from
    # them (an all-reduce in stages 1-2, an all-gather in stage 3) and returns None where there
    # is none: a frozen parameter, or a model prepared without an optimizer.
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    full: dict[int, torch.Tensor] = {}
    params = dict(module.named_parameters(remove_duplicate=False))
    for param in params.values():  # the same order on every rank, as collectives need
        if id(param) in full:
            continue  # tied weights: one collective per tensor
        value = None
        if hasattr(param, "_hp_mapping") or getattr(param, "_z3_optimizer", None) is not None:
            value = safe_get_full_fp32_param(param)
        if value is None:
            # Stage 3 keeps even these partitioned; gathering is a no-op in stages 0-2.
            with deepspeed.zero.GatheredParameters([param], enabled=hasattr(param, "ds_id")):
                value = param.data.detach().clone()
        full[id(param)] = value.detach().to("cpu", torch.float32)
    buffers = dict(module.named_buffers(remove_duplicate=False))
    state: dict[str, torch.Tensor] = {}
    # The keys of state_dict(): parameters and persistent buffers, tied names included.
    for key in module.state_dict().keys():
        if key in params:
            state[key] = full[id(params[key])]
        elif key in buffers:
            state[key] = _fp32_cpu({key: buffers[key]})[key]
    return state


def _fp32_cpu(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    # Clone: the snapshot must not change as training goes on, nor share memory between tied
    # names (safetensors refuses shared tensors). Integer buffers keep their type.
    out = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            continue  # get_extra_state() objects have no place in safetensors
        dtype = torch.float32 if value.is_floating_point() else value.dtype
        out[key] = value.detach().to("cpu", dtype, copy=True)
    return out


def save_exported(
    state_dict: dict[str, torch.Tensor], out_dir: str | os.PathLike, *,
    model_name: str, dataset: str, extra: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """Write `out_dir/model.safetensors` and `out_dir/model_config.json` (main process only).

    A new directory appears whole or not at all. An existing one has its two files replaced one
    after the other; the config names the weights' sha256, so that `load_model` refuses the pair
    a crash between the two would leave.
    """
    from safetensors.torch import save_file

    from ..data.catalog import DATASETS

    extra = dict(extra or {})
    if dataset in DATASETS:
        spec = DATASETS[dataset]
    elif dataset.startswith("hf:"):
        spec = DATASETS["mnist"]  # Hugging Face copies of MNIST; extra may give other constants
    else:
        raise UsageError(f"cannot export: unknown dataset {dataset!r} (choose one of: {', '.join(DATASETS)}, hf:NAME)")
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    out_dir = Path(out_dir)
    # Beside the target, so that the final rename stays on one file system; made with mkdir
    # rather than mkdtemp, whose mode 0700 the export would keep.
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with writing("the export", out_dir):
            tmp.mkdir(parents=True)
            save_file(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
            config = {
                "model": model_name, "dataset": dataset, "num_classes": 10, "input_shape": [1, 28, 28],
                "mean": spec.mean, "std": spec.std, "format_version": FORMAT_VERSION,
                "weights_sha256": _sha256(tmp / WEIGHTS_FILE), **extra,
            }  # fmt: skip
            (tmp / CONFIG_FILE).write_bytes(json_bytes(config))
            for name in (WEIGHTS_FILE, CONFIG_FILE):
                fsync_file(tmp / name)
            if out_dir.is_dir() and any(out_dir.iterdir()):
                # Other files may share the directory (a run's results, say): replace only ours,
                # the weights first, since the config is what vouches for them.
                for name in (WEIGHTS_FILE, CONFIG_FILE):
                    os.replace(tmp / name, out_dir / name)
            else:
                os.replace(tmp, out_dir)  # rename(2) may replace an empty directory
    except OSError as e:  # what the storage did not refuse: a path that is a file, say
        raise UsageError(f"cannot write the export to {out_dir}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def export_from_checkpoint(
    checkpoint_dir: str | os.PathLike, out_dir: str | os.PathLike, *, trust_checkpoint: bool = False
) -> Path:
    """Export the model of a checkpoint that `accelerator.save_state` wrote, with its trainer_state.json.

    DeepSpeed shards and FSDP files are pickles: they are read with restricted unpicklers
    (checkpoint_weights.py), unless `trust_checkpoint` lets DeepSpeed unpickle anything.
    """
    ckpt = Path(checkpoint_dir)
    if not ckpt.is_dir():
        raise UsageError(f"{ckpt}: no such checkpoint directory")
    state = _read_json(ckpt / STATE_FILE, "checkpoint state (written with the checkpoint)")
    config = state.get("config")
    if not isinstance(config, dict) or not isinstance(config.get("dataset"), str):
        raise UsageError(f"{ckpt / STATE_FILE}: no training config with a dataset (key 'config')")
    # A user-defined model is trained under a registry name in the config; the checkpoint
    # writer records the class name at the top level.
    model_name = state.get("model") or config.get("model")
    if not isinstance(model_name, str):
        raise UsageError(f"{ckpt / STATE_FILE}: no model name")

    weights = _fp32_cpu(_strip_wrapper_prefixes(checkpoint_weights(ckpt, trust_checkpoint)))
    from ..models import MODELS

    if model_name in MODELS:  # fail now, not at load time, if the name does not fit the weights
        where = f"{ckpt}: the checkpoint's weights"
        _check_fits(_registry_model(model_name, config, weights, where), weights, where, model_name)
    extra = {"step": state.get("step")}
    if model_name == "mlp" and config.get("mlp_hidden") is not None:
        extra["mlp_hidden"] = config["mlp_hidden"]
    for key in ("mean", "std"):  # a run on other data may record its own constants
        if key in state:
            extra[key] = state[key]
    return save_exported(weights, out_dir, model_name=model_name, dataset=config["dataset"], extra=extra)


def _strip_wrapper_prefixes(state: dict[str, Any]) -> dict[str, Any]:
    # save_state keeps the model from before DDP wrapped it, so keys come unprefixed; this is
    # for weights saved from a wrapper ("module." of DDP, "_orig_mod." of torch.compile).
    for prefix in ("module.", "_orig_mod."):
        while state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def load_model(path: str | os.PathLike, model: nn.Module | None = None) -> nn.Module:
    """The exported model in `path`, on CPU in eval mode; weights are read with safetensors only.

    `model` is required for a user-defined model (one not in the registry) and gets the weights.
    """
    from ..models import MODELS

    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: no such exported model directory")
    config = read_export_config(path)
    name = config["model"]
    if model is None:
        if name not in MODELS:
            raise UsageError(
                f"{path / CONFIG_FILE}: model {name!r} is not in the registry ({', '.join(MODELS)}); "
                "pass the module: load_model(path, model=...)"
            )
    weights_file = path / WEIGHTS_FILE
    if not weights_file.is_file():
        raise UsageError(f"{weights_file}: missing (an export holds {WEIGHTS_FILE} and {CONFIG_FILE})")
    expected = config.get("weights_sha256")
    if expected is not None and _sha256(weights_file) != expected:
        raise UsageError(
            f"{weights_file}: does not match the sha256 in {CONFIG_FILE} (changed, or an interrupted export)"
        )
    weights = read_safetensors(weights_file)
    if model is None:
        model = _registry_model(name, config, weights, f"{weights_file}: the weights")
    model = model.to("cpu")
    _check_fits(model, weights, f"{weights_file}: the weights", name)
    try:
        model.load_state_dict(weights, strict=True)
    except RuntimeError as e:
        raise UsageError(f"{weights_file}: does not fit model {name!r}: {one_line(e)}") from None
    return model.eval()


def _registry_model(name: str, config: dict[str, Any], weights: dict[str, torch.Tensor], where: str) -> nn.Module:
    """The registry's model `name`, an mlp with the config's `mlp_hidden` widths only where the
    weights hold as many elements: a file's few bytes never make a model larger than its weights."""
    from ..models import MLP, build_model, check_mlp_hidden, mlp_num_parameters

    widths = config.get("mlp_hidden") if name == "mlp" else None
    if widths is None:
        return build_model(name)
    hidden = check_mlp_hidden(name, widths)
    if mlp_num_parameters(hidden) != sum(w.numel() for w in weights.values()):
        raise UsageError(f"{where} do not fit model 'mlp' with mlp_hidden {widths}")
    return MLP(hidden)


def read_export_config(path: str | os.PathLike) -> dict[str, Any]:
    """model_config.json of the export in `path`, checked for the keys that loading needs."""
    config = _read_json(Path(path) / CONFIG_FILE, "not an exported model directory")
    file = Path(path) / CONFIG_FILE
    if config.get("format_version") != FORMAT_VERSION:
        version = config.get("format_version")
        raise UsageError(f"{file}: format_version {version!r}; this version of accel_mnist reads {FORMAT_VERSION}")
    for key, kind in (("model", str), ("dataset", str), ("mean", (int, float)), ("std", (int, float))):
        if not isinstance(config.get(key), kind) or isinstance(config.get(key), bool):
            raise UsageError(f"{file}: missing or invalid {key!r}")
    return config


def _read_json(file: Path, what: str) -> dict[str, Any]:
    if not file.is_file():
        raise UsageError(f"{file}: missing ({what})")
    return read_json_object(file)


def _check_fits(model: nn.Module, weights: dict[str, torch.Tensor], where: str, name: str) -> None:
    """One-line UsageError unless `weights` has exactly the keys and shapes of `model`."""
    wanted = model.state_dict()
    problems = []
    missing = [k for k in wanted if k not in weights]
    unexpected = [k for k in weights if k not in wanted]
    if missing:
        problems.append("missing " + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
    if unexpected:
        problems.append("unexpected " + ", ".join(unexpected[:5]) + (" ..." if len(unexpected) > 5 else ""))
    for key in wanted:
        if key in weights and weights[key].shape != wanted[key].shape:
            problems.append(f"{key} has shape {tuple(weights[key].shape)}, the model {tuple(wanted[key].shape)}")
            break
    if problems:
        raise UsageError(f"{where} do not fit model {name!r}: {'; '.join(problems)}")
