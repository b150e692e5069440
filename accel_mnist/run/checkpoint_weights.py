"""The model weights inside a checkpoint folder that `accelerator.save_state` wrote, under any strategy.

Plain runs: `model.safetensors`. DeepSpeed: the engine's shards under `pytorch_model/`. FSDP:
`pytorch_model_fsdp.bin` (FULL_STATE_DICT, a torch.save file) or `pytorch_model_fsdp_0/`
(SHARDED_STATE_DICT, a torch.distributed.checkpoint folder). Every pickle among them is read
with an allow-list: torch's restricted unpickler for torch.save files, and one of our own for
the DCP metadata, which torch reads with plain `pickle.load`.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ..caller import setting
from ..errors import UsageError, one_line
from .safe_load import MAX_METADATA_BYTES, allowed_globals, check_dcp_metadata, refusal, weights_only_loads

# What accelerate 1.15's save_state writes for the first prepared model: SAFE_WEIGHTS_NAME
# (pytorch_model.bin only with safe_serialization=False, which this project never asks for);
# under DeepSpeed the engine's own checkpoint under the tag MODEL_NAME, "pytorch_model"; under
# FSDP f"{FSDP_MODEL_NAME}.bin" (full) or f"{FSDP_MODEL_NAME}_0/" (sharded).
ACCELERATE_WEIGHTS = "model.safetensors"
DEEPSPEED_TAG = "pytorch_model"
FSDP_FULL = "pytorch_model_fsdp.bin"
FSDP_SHARDED = "pytorch_model_fsdp_0"
# Accelerate's save_custom_state names the first registered object's file so; a run registers one, its
# average of the weights where it has ema_decay.
AVERAGE_FILE = "custom_checkpoint_0.pkl"


def checkpoint_weights(ckpt: Path, trust: bool = False) -> dict[str, Any]:
    """The model's state dict stored in checkpoint folder `ckpt` (tensors on the CPU)."""
    if (ckpt / DEEPSPEED_TAG).is_dir():
        return _deepspeed_weights(ckpt, trust)
    if (ckpt / FSDP_SHARDED).is_dir():
        return _fsdp_sharded_weights(ckpt / FSDP_SHARDED)
    if (ckpt / FSDP_FULL).is_file():
        return _torch_save_weights(ckpt / FSDP_FULL)
    if (ckpt / ACCELERATE_WEIGHTS).is_file():
        return read_safetensors(ckpt / ACCELERATE_WEIGHTS)
    raise UsageError(
        f"{ckpt}: incomplete checkpoint: no {ACCELERATE_WEIGHTS} (accelerator.save_state), "
        f"no {DEEPSPEED_TAG}/ (DeepSpeed) and no {FSDP_SHARDED}/ or {FSDP_FULL} (FSDP)"
    )


def read_safetensors(file: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    # load_file parses a JSON header and copies raw bytes: nothing in the file is executed.
    try:
        return load_file(file, device="cpu")
    except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{file}: not a valid safetensors file ({one_line(e)})") from None


def _tensors_only(file: Path, what: str) -> Any:
    """What torch.save wrote to `file`, read with torch's restricted unpickler and no class beyond its own
    (tensors, containers, numbers); a one-line UsageError naming `what` where it cannot be read so."""
    try:
        with weights_only_loads([]):
            return torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        raise UsageError(f"{file}: holds objects other than tensors ({_global_named(e)}); not loaded") from None
    except (OSError, RuntimeError, ValueError, EOFError) as e:
        raise UsageError(f"{file}: unreadable {what}: {one_line(e)}") from None


def _torch_save_weights(file: Path) -> dict[str, Any]:
    # FSDP's full state dict, written by torch.save on rank 0: tensors in a dict, nothing else.
    state = _tensors_only(file, "FSDP checkpoint")
    if not isinstance(state, dict):
        raise UsageError(f"{file}: expected a state dict, got {type(state).__name__}")
    return state


def averaged_weights(ckpt: Path) -> dict[str, torch.Tensor]:
    """The averaged parameters (`ema_decay`, training/averaging.py) that checkpoint folder `ckpt` holds, by
    name: the one object a run registers for Accelerate's checkpoints, read with torch's restricted unpickler."""
    file = ckpt / AVERAGE_FILE
    if not file.is_file():
        raise UsageError(f"{ckpt}: trained with ema_decay, but holds no {AVERAGE_FILE} (the averaged weights)")
    average = average_in(_tensors_only(file, "averaged weights"))
    if average is None:
        raise UsageError(f"{file}: not the averaged weights of a run (a step count and tensors by name)")
    return average


def average_in(state: Any) -> dict[str, torch.Tensor] | None:
    """The tensors by name of WeightAverage.state_dict's `state` (training/averaging.py), or None where
    `state` is not one."""
    if not isinstance(state, dict) or not isinstance(state.get("updates"), int):
        return None
    average = state.get("average")
    if not isinstance(average, dict):
        return None
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in average.items()):
        return None
    return average


def _fsdp_sharded_weights(shard_dir: Path) -> dict[str, Any]:
    """Merge an FSDP sharded (DCP) model folder with Accelerate's merge_fsdp_weights."""
    from accelerate.utils import merge_fsdp_weights

    metadata = shard_dir / ".metadata"
    if not metadata.is_file() or not any(shard_dir.glob("*.distcp")):
        raise UsageError(f"{shard_dir}: incomplete FSDP checkpoint: needs .metadata and *.distcp files")
    if metadata.stat().st_size > MAX_METADATA_BYTES:
        raise UsageError(f"{metadata}: {metadata.stat().st_size} bytes, more than a checkpoint's metadata can need")
    raw = metadata.read_bytes()
    check_dcp_metadata(raw, metadata)
    with tempfile.TemporaryDirectory(prefix="accel_mnist_fsdp_") as tmp:
        # torch.distributed.checkpoint unpickles .metadata with plain pickle.load: merge from a
        # folder whose .metadata is the copy checked above (so the file cannot change between
        # the check and the load), with the data files linked, not copied.
        staged, merged = Path(tmp) / "model", Path(tmp) / "merged"
        staged.mkdir()
        (staged / ".metadata").write_bytes(raw)
        for data in shard_dir.glob("*.distcp"):
            os.symlink(data.resolve(), staged / data.name)
        try:
            # Every entry of the .distcp files goes through torch.load, the non-tensor ones with
            # weights_only=False, which the context overrides.
            with _quiet(), weights_only_loads([]):
                merge_fsdp_weights(str(staged), str(merged), safe_serialization=True)
        except pickle.UnpicklingError as e:
            what = _global_named(e)
            raise UsageError(f"{shard_dir}: holds objects other than tensors ({what}); not loaded") from None
        except (OSError, RuntimeError, ValueError, KeyError) as e:
            raise UsageError(f"{shard_dir}: incomplete or unreadable FSDP checkpoint: {one_line(e)}") from None
        return read_safetensors(merged / ACCELERATE_WEIGHTS)


def _deepspeed_weights(ckpt: Path, trust: bool) -> dict[str, Any]:
    """Consolidate the fp32 master weights from the ZeRO shards under `ckpt/pytorch_model/`."""
    shard_dir = ckpt / DEEPSPEED_TAG
    for pattern in ("*_model_states.pt", "*_optim_states.pt"):
        if not any(shard_dir.glob(pattern)):
            raise UsageError(f"{shard_dir}: incomplete DeepSpeed checkpoint: no {pattern} files")
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    # DeepSpeed's loader unpickles every *_model_states.pt and *_optim_states.pt there with
    # torch.load(weights_only=False), and unpickling may run any code a file names. Besides
    # tensors and plain containers they hold four DeepSpeed types (seen with 0.19.8, fp32 and
    # bf16, stages 1-3; DynamicLossScaler under fp16): so unless told to trust the checkpoint,
    # force torch's restricted unpickler on those loads and allow those types alone.
    allowed = allowed_globals(deepspeed=True)
    try:
        with _quiet(), contextlib.nullcontext() if trust else weights_only_loads(allowed):
            return get_fp32_state_dict_from_zero_checkpoint(str(ckpt), tag=DEEPSPEED_TAG)
    except pickle.UnpicklingError as e:
        raise UsageError(
            f"{shard_dir}: holds a pickled {_global_named(e)}, which is not unpickled unless you trust the "
            f"checkpoint ({setting('trust_checkpoint', True)})"
        ) from None
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        raise UsageError(f"{shard_dir}: incomplete or unreadable DeepSpeed checkpoint: {one_line(e)}") from None


def _global_named(e: Exception) -> str:
    return refusal(e) or one_line(e)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    # DeepSpeed and Accelerate print progress (stdout) and bars (stderr); the CLI's output is ours.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield
