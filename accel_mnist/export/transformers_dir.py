"""A transformers model's export is a Hugging Face folder too: `config.json` beside the export's
one `model.safetensors`, as `save_pretrained` writes them, so that
`AutoModelForImageClassification.from_pretrained(folder)` loads it; accel_mnist's own
`model_config.json` stays beside them for `load_model`, `evaluate` and `predict`.

A run's output directory has a config.json of its own (the training config), so there the
Hugging Face folder is `hf/`, beside the run's export: a whole export again, whose weights are
the same file (a hard link; where the file system has none, a copy checked equal).

The weights keep the names of the module's `state_dict()` under the transformers version that
trained it (transformers 5 also reads the older names `save_pretrained` writes for some models,
but not the other way round). Loading rebuilds the model from transformers' own classes: the
architecture named in config.json must be one transformers has; no code from the folder runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from torch import nn

from ..errors import UsageError, one_line
from ..files import json_bytes, read_json_if_valid

HF_CONFIG_FILE = "config.json"
HF_SUBDIR = "hf"
# Where model_config.json may say the Hugging Face config is (never a path of the folder's choosing).
HF_CONFIG_PLACES = (HF_CONFIG_FILE, f"{HF_SUBDIR}/{HF_CONFIG_FILE}")


def hf_files(
    out_dir: Path, hf: dict[str, Any], weights: str, export: tuple[str, dict[str, Any]]
) -> dict[str, bytes | str]:
    """The files that make the export to `out_dir` a Hugging Face folder too, by their path in it:
    config.json (the contents `hf`) beside the export's own files, or, where `out_dir` has a
    config.json of another kind (a run's training config), a whole export again in `hf/`:
    config.json, the export's config (`export`: its name and contents) and its weights, given as
    `weights`, the name of the export's file that it is the same file as."""
    existing = read_json_if_valid(out_dir / HF_CONFIG_FILE)
    if not (out_dir / HF_CONFIG_FILE).exists() or (isinstance(existing, dict) and "model_type" in existing):
        return {HF_CONFIG_FILE: json_bytes(hf)}
    name, config = export
    return {
        f"{HF_SUBDIR}/{HF_CONFIG_FILE}": json_bytes(hf),
        f"{HF_SUBDIR}/{name}": json_bytes({**config, "transformers_config": HF_CONFIG_FILE}),
        f"{HF_SUBDIR}/{weights}": weights,
    }


def _transformers_class(module: nn.Module) -> type | None:
    """The first class of transformers' own in the module's class hierarchy, if any."""
    return next((c for c in type(module).__mro__ if c.__module__.startswith("transformers.")), None)


def hf_config(module: nn.Module, class_names: Sequence[str] | None = None) -> dict[str, Any] | None:
    """The config.json that `save_pretrained` would write for a transformers model (None for any
    other module), with the data's class names as its labels and float32 as its dtype (an
    export's weights are fp32, whatever precision trained them)."""
    base = _transformers_class(module)
    config: Any = getattr(module, "config", None)
    if base is None or not hasattr(config, "to_json_string"):
        return None
    data = json.loads(config.to_json_string(use_diff=True))
    # A subclass of the caller's own is saved as the transformers class it extends, which
    # load_model can rebuild; save_pretrained would name the subclass.
    data["architectures"] = [base.__name__]
    if class_names and len(class_names) == getattr(config, "num_labels", None):
        data["id2label"] = {str(i): name for i, name in enumerate(class_names)}
        data["label2id"] = {name: i for i, name in enumerate(class_names)}
    for key in ("dtype", "torch_dtype"):  # transformers 5 and 4 spell it differently
        if key in data:
            data[key] = "float32"
    return data


def build_from_config(raw: dict[str, Any], where: str) -> nn.Module:
    """The transformers model `raw` (a config.json's contents) describes, with fresh weights."""
    import transformers

    model_type, architectures = raw.get("model_type"), raw.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    if not isinstance(model_type, str) or model_type not in transformers.CONFIG_MAPPING:
        raise UsageError(f"{where}: model_type {model_type!r} is not one transformers knows")
    cls = getattr(transformers, arch, None) if isinstance(arch, str) else None
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise UsageError(
            f"{where}: architecture {arch!r} is not a model class of transformers (code from the folder is "
            "never run); pass the module: load_model(path, model=...)"
        )
    try:
        return cls(transformers.CONFIG_MAPPING[model_type].from_dict(raw))
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise UsageError(f"{where}: cannot build {arch} from it: {one_line(e)}") from None
