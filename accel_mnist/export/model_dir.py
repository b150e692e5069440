"""Exported models: full fp32 weights in safetensors plus a small JSON config.

An export is a directory holding `model.safetensors` and `model_config.json` (model, data:
classes, image shape, normalisation), and, for a transformers model, the `config.json` that makes
it a Hugging Face folder as well (transformers_dir.py). It is made from a live run
(`full_state_dict` + `save_exported`) or from a checkpoint that `accelerator.save_state` wrote
(`export_from_checkpoint`), under any strategy, and it loads with `load_model` in a plain
process: no Accelerate, no DeepSpeed, and no pickle.
"""

from __future__ import annotations

import filecmp
import hashlib
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..distributed.gather import fp32_cpu, full_state_dict, strip_wrapper_prefixes
from ..errors import UsageError, one_line
from ..files import fsync_file, json_bytes, read_json_object, writing
from ..run.checkpoint import STATE_FILE
from ..run.checkpoint_weights import AVERAGE_FILE, averaged_weights, checkpoint_weights, read_safetensors
from .transformers_dir import HF_CONFIG_PLACES, hf_files

__all__ = ["export_from_checkpoint", "full_state_dict", "load_model", "read_export_config", "save_exported"]

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "model_config.json"
FORMAT_VERSION = 1


def export_prepared(
    accelerator: Any, model: nn.Module, out_dir: Path, model_name: str, dataset: str, extra: dict[str, Any],
    transformers_config: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Export a prepared model (call on every process): gathered where sharded, written by the
    main process; a write the storage refuses there stops every process with the same error."""
    from ..distributed.consensus import agree

    weights = full_state_dict(accelerator, model)

    def write() -> None:
        save_exported(weights, out_dir, model_name=model_name, dataset=dataset, extra=extra,
                      transformers_config=transformers_config)  # fmt: skip

    agree(accelerator, lambda: write() if accelerator.is_main_process else None)


def save_exported(
    state_dict: dict[str, torch.Tensor], out_dir: str | os.PathLike, *,
    model_name: str, dataset: str, extra: dict[str, Any] | None = None,
    transformers_config: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    """Write `out_dir/model.safetensors` and `out_dir/model_config.json` (main process only), and
    with `transformers_config` (a config.json's contents) a Hugging Face folder: `out_dir` itself,
    or `out_dir/hf` in a run's output directory (transformers_dir.py).

    `extra` adds to or overrides the config's keys (mean, std, num_classes, class_names,
    input_shape, step); mean and std default to the dataset's own constants.
    A new directory appears whole or not at all. An existing one has its files replaced one
    after the other, model_config.json last; it names the weights' sha256, so that `load_model`
    refuses the set a crash in between would leave.
    """
    out_dir = Path(out_dir)
    # Beside the target, so that the final rename stays on one file system; made with mkdir
    # rather than mkdtemp, whose mode 0700 the export would keep.
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with writing("the export", out_dir):
            files = _export_files(state_dict, tmp, out_dir, model_name, dataset, dict(extra or {}), transformers_config)
            for name, data in files.items():
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                if isinstance(data, bytes):
                    (tmp / name).write_bytes(data)
                elif data != name:  # the same file as `data`: a hard link, or where there are none a copy checked equal
                    try:
                        os.link(tmp / data, tmp / name)
                    except OSError:
                        shutil.copyfile(tmp / data, tmp / name)
                        if not filecmp.cmp(tmp / data, tmp / name, shallow=False):
                            raise OSError(
                                f"the copy of {data} in {Path(name).parent}/ differs from the original"
                            ) from None
                fsync_file(tmp / name)
            if out_dir.is_dir() and any(out_dir.iterdir()):
                # Other files may share the directory (a run's results, say): replace only ours,
                # model_config.json last, since it is what vouches for the weights.
                for entry in dict.fromkeys(name.split("/")[0] for name in files):
                    if (tmp / entry).is_dir() and (out_dir / entry).exists():
                        os.replace(out_dir / entry, tmp / f".old-{entry}")  # a folder cannot replace a folder
                    os.replace(tmp / entry, out_dir / entry)
            else:
                os.replace(tmp, out_dir)  # rename(2) may replace an empty directory
    except OSError as e:  # what the storage did not refuse: a path that is a file, say
        raise UsageError(f"cannot write the export to {out_dir}: {e.strerror or e}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def _export_files(state_dict: dict[str, torch.Tensor], tmp: Path, out_dir: Path, model_name: str, dataset: str,
                  extra: dict[str, Any], hf: dict[str, Any] | None) -> dict[str, bytes | str]:  # fmt: skip
    """The weights written into `tmp` (the export's folder being built), then every other file of the export to
    `out_dir` by its path in it, in the order they replace an existing export's (model_config.json last): each
    its bytes, or the name of the file it is the same file as. Mean and std are the dataset's (MNIST's for its
    copies, hf:NAME) unless `extra` has its own; an unknown dataset is refused before anything is written."""
    from safetensors.torch import save_file

    from ..data.catalog import DATASETS

    spec = DATASETS.get(dataset) or (DATASETS["mnist"] if dataset.startswith("hf:") else None)
    if spec is None and not ("mean" in extra and "std" in extra):
        raise UsageError(f"cannot export: unknown dataset {dataset!r} (choose one of: {', '.join(DATASETS)}, hf:NAME)")
    tmp.mkdir(parents=True)
    # Streamed from the tensors (safetensors' save would hold a serialised copy of every weight in memory).
    tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
    save_file(tensors, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
    config = {
        "model": model_name, "dataset": dataset, "num_classes": 10, "input_shape": [1, 28, 28],
        "mean": spec.mean if spec else None, "std": spec.std if spec else None,
        "format_version": FORMAT_VERSION, "weights_sha256": _sha256(tmp / WEIGHTS_FILE), **extra,
    }  # fmt: skip
    files: dict[str, bytes | str] = {WEIGHTS_FILE: WEIGHTS_FILE}  # written above
    if hf:
        files.update(hf_files(out_dir, hf, WEIGHTS_FILE, (CONFIG_FILE, config)))
        config["transformers_config"] = next(place for place in HF_CONFIG_PLACES if place in files)
    files[CONFIG_FILE] = json_bytes(config)
    return files


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
    hf = state.get("transformers_config")
    # A user-defined model is trained under a registry name in the config; the checkpoint
    # writer records the class name at the top level.
    model_name = state.get("model") or config.get("model")
    if not isinstance(model_name, str):
        raise UsageError(f"{ckpt / STATE_FILE}: no model name")

    weights = fp32_cpu(strip_wrapper_prefixes(checkpoint_weights(ckpt, trust_checkpoint)))
    if config.get("ema_decay") is not None:  # the run evaluated, and exports, its average of the weights
        weights = _with_average(ckpt, weights)
    extra: dict[str, Any] = {"step": state.get("step")}
    if model_name == "mlp" and config.get("mlp_hidden") is not None:
        extra["mlp_hidden"] = config["mlp_hidden"]
    # A run records its data's constants and classes (older checkpoints: mean and std only).
    extra.update((k, state[k]) for k in ("mean", "std", "num_classes", "class_names", "input_shape") if k in state)
    # Fail now, not at load time, if the model does not fit the weights.
    _fresh_model(ckpt / STATE_FILE, {"model": model_name, **extra}, hf, weights, f"{ckpt}: the checkpoint's weights")
    dataset = state.get("dataset") or config["dataset"]
    return save_exported(
        weights, out_dir, model_name=model_name, dataset=dataset, extra=extra,
        transformers_config=hf if isinstance(hf, dict) else None,
    )  # fmt: skip


def _with_average(ckpt: Path, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`weights` with the checkpoint's averaged parameters in place of the parameters as trained."""
    average = strip_wrapper_prefixes(averaged_weights(ckpt))
    if any(weights.get(k) is None or weights[k].shape != v.shape for k, v in average.items()):
        raise UsageError(f"{ckpt / AVERAGE_FILE}: its averaged weights do not fit the checkpoint's model")
    return {**weights, **fp32_cpu(average)}


def _fresh_model(
    where: Path, config: dict[str, Any], hf: Any, weights: dict[str, torch.Tensor], fits: str
) -> nn.Module | None:
    """A fresh model of the registry's (sized to the classes) or of transformers' (from its
    config.json contents `hf`, read from `where`), as `config` describes it, checked against
    `weights` first on the meta device: a few bytes of config never make a model larger than its
    weights. None for a module of the caller's own."""
    from ..models import MODELS

    name = config["model"]
    if name in MODELS:

        def build() -> nn.Module:
            return _registry_model(name, config, weights, fits)
    elif isinstance(hf, dict):
        from .transformers_dir import build_from_config

        def build() -> nn.Module:
            return build_from_config(hf, str(where))
    else:
        return None
    with torch.device("meta"):
        _check_fits(build(), weights, fits, name)
    return build()


def load_model(path: str | os.PathLike, model: nn.Module | None = None) -> nn.Module:
    """The exported model in `path`, on CPU in eval mode; weights are read with safetensors only.

    A registry model is built with the export's number of classes, a transformers model from its
    config.json; `model` is required for any other module (one of the caller's own) and gets the
    weights.
    """
    from ..models import MODELS

    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path}: no such exported model directory")
    config = read_export_config(path)
    name = config["model"]
    hf = config.get("transformers_config")
    if model is None and name not in MODELS and not hf:
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
        where = path / hf if hf else path / CONFIG_FILE
        raw = _read_json(where, "a transformers model's config") if hf else None
        model = _fresh_model(where, config, raw, weights, f"{weights_file}: the weights")
        assert model is not None  # a registry name or a transformers config (checked above)
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

    widths, classes = config.get("mlp_hidden") if name == "mlp" else None, config.get("num_classes", 10)
    if widths is None:
        return build_model(name, num_classes=classes)
    hidden = check_mlp_hidden(name, widths)
    if mlp_num_parameters(hidden, classes) != sum(w.numel() for w in weights.values()):
        raise UsageError(f"{where} do not fit model 'mlp' with mlp_hidden {widths}")
    return MLP(hidden, num_classes=classes)


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
    # Optional (exports before them were of 10 classes of 1x28x28 images, unnamed).
    classes, names, shape = config.get("num_classes", 10), config.get("class_names"), config.get("input_shape")
    if not isinstance(classes, int) or isinstance(classes, bool) or classes < 1:
        raise UsageError(f"{file}: invalid 'num_classes' {classes!r}")
    if names is not None and not (isinstance(names, list) and len(names) == classes
                                  and all(isinstance(n, str) for n in names)):  # fmt: skip
        raise UsageError(f"{file}: 'class_names' must be {classes} names")
    if shape is not None and not (isinstance(shape, list) and len(shape) == 3
                                  and all(isinstance(d, int) and d > 0 for d in shape)):  # fmt: skip
        raise UsageError(f"{file}: 'input_shape' must be [channels, height, width]")
    if config.get("transformers_config") not in (None, *HF_CONFIG_PLACES):
        raise UsageError(f"{file}: 'transformers_config' must be one of {', '.join(HF_CONFIG_PLACES)}")
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
