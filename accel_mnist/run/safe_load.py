"""Reading checkpoints from elsewhere without running code they name.

Accelerate's optimizer, scheduler and RNG files and DeepSpeed's shards are pickles, and
unpickling may call any function a file names. Two layers keep that from happening unless the
user says the checkpoint is theirs (`--trust-checkpoint`):

- `read_checkpoint_files` reads every pickle-based file of a checkpoint with torch's restricted
  (weights-only) unpickler and `allowed_globals()` before anything loads it, so that a refusal
  names the file;
- `weights_only_loads` then forces the same unpickler on every `torch.load` inside it, even
  those that ask for `weights_only=False` (DeepSpeed's shards, Accelerate's custom states), so
  that a file changed after the check is refused too.

FSDP's sharded `.metadata` files are read by torch with plain `pickle.load`: they are checked
with an unpickler of the project's own that allows the few classes they hold, once, before
loading (so a file changed between the check and the load is not caught).

The cost: each pickle is unpickled twice (the check maps tensor data rather than reading it),
and under DeepSpeed every process checks every shard, not only its own.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import random
import re
import sys
import warnings
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..caller import setting
from ..errors import UsageError, one_line

# What accelerate and DeepSpeed name their pickles; model weights are safetensors, read
# without unpickling, and the JSON and text files are parsed, not executed.
PICKLE_SUFFIXES = (".bin", ".pkl", ".pt", ".pth")
RNG_FILE = "random_states_{}.pkl"
_REFUSED = re.compile(r"GLOBAL (\S+) was not an allowed global|Unsupported global: GLOBAL (\S+)")
_FORCE = ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")


def allowed_globals(deepspeed: bool = False) -> list[Any]:
    """The classes and functions a checkpoint of this project may name besides torch's defaults.

    numpy's array reconstruction is what `np.random.get_state()` pickles to (Accelerate's RNG
    files); the four DeepSpeed types are what its ZeRO shards hold (seen with 0.19.8, fp32 and
    bf16, stages 1-3; the loss scalers under fp16).
    """
    import codecs

    core = np._core if hasattr(np, "_core") else np.core
    allowed: list[Any] = [core.multiarray._reconstruct, np.ndarray, np.dtype, codecs.encode]
    if hasattr(np, "dtypes"):
        allowed.append(np.dtypes.UInt32DType)
    if deepspeed:
        from ..distributed.deepspeed_pickles import pickled_types

        allowed += pickled_types()
    return allowed


@contextlib.contextmanager
def weights_only_loads(allowed: list[Any] | None = None) -> Iterator[None]:
    """Every `torch.load` inside uses the restricted unpickler, allowing `allowed` besides torch's defaults.

    torch.load reads TORCH_FORCE_WEIGHTS_ONLY_LOAD at every call, and it overrides an explicit
    weights_only=False; TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD would contradict it, so it is unset
    meanwhile. Both are process-wide: nothing else should load files while this is active.
    """
    # DeepSpeed's types only where it runs (importing it costs seconds and prints warnings).
    allowed = allowed_globals(deepspeed="deepspeed" in sys.modules) if allowed is None else allowed
    saved = {k: os.environ.pop(k, None) for k in _FORCE}
    os.environ["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
    try:
        with torch.serialization.safe_globals(allowed):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def refusal(error: BaseException) -> str | None:
    """The global a weights-only load refused, from its error; None if it was refused for another reason."""
    found = _REFUSED.search(str(error))
    return (found.group(1) or found.group(2)) if found else None


def load_file(path: Path, allowed: list[Any]) -> Any:
    """`path` unpickled with the restricted unpickler; a one-line UsageError naming it otherwise."""
    try:
        # mmap: tensor data stays on disk, so checking a large shard costs little memory;
        # it needs torch.save's zip format, and anything else is a bare pickle.
        mmap = zipfile.is_zipfile(path)
        with torch.serialization.safe_globals(allowed), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. about pickle protocols: the error says enough
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as e:
        what = refusal(e)
        if what is not None:
            raise UsageError(
                f"{path}: holds a pickled {what}, which is not loaded unless you trust the checkpoint "
                f"({setting('trust_checkpoint', True)})"
            ) from None
        raise UsageError(
            f"{path}: corrupt, or not loadable without unpickling arbitrary objects ({one_line(e)})"
        ) from None
    except (OSError, EOFError, RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UsageError(f"{path}: corrupt or unreadable checkpoint file ({one_line(e)})") from None


# A DCP .metadata lists every tensor's chunks: kilobytes for these models. The cap keeps a
# hostile file from exhausting memory before it is even checked.
MAX_METADATA_BYTES = 64 << 20


# What torch 2.13-2.14 pickles into a DCP .metadata (seen for FSDP2 sharded model states).
_DCP_METADATA_MODULE = "torch.distributed.checkpoint.metadata"
_DCP_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        allowed = (module, name) in _DCP_ALLOWED or module == _DCP_METADATA_MODULE
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            allowed = True  # dtypes pickle as torch.float32 and the like
        if not allowed:
            raise pickle.UnpicklingError(f"GLOBAL {module}.{name} was not an allowed global")
        return super().find_class(module, name)


def check_dcp_metadata(raw: bytes, where: Path) -> None:
    """UsageError unless `raw` unpickles, with the allow-list, to torch.distributed.checkpoint metadata."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        metadata = _MetadataUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as e:
        raise UsageError(f"{where}: holds a pickled {refusal(e) or one_line(e)}, which is not unpickled") from None
    except (EOFError, ValueError, TypeError, AttributeError, IndexError) as e:
        raise UsageError(f"{where}: unreadable checkpoint metadata: {one_line(e)}") from None
    if not isinstance(metadata, Metadata):
        raise UsageError(f"{where}: not torch.distributed.checkpoint metadata ({type(metadata).__name__})")


def pickle_files(checkpoint: Path) -> list[Path]:
    """The files of `checkpoint` (at any depth) that accelerate or DeepSpeed would unpickle."""
    return sorted(p for p in checkpoint.rglob("*") if p.suffix in PICKLE_SUFFIXES and p.is_file())


def read_checkpoint_files(checkpoint: Path, process_index: int, trust: bool) -> dict[str, Any]:
    """Check `checkpoint` before it is loaded; return this process's RNG states from it.

    Without `trust`, every pickle-based file must load with the restricted unpickler. The RNG
    file of this process must exist and hold every state this machine would restore, trusted or
    not: Accelerate skips one it cannot load with only a log line, and the resume would then no
    longer be exact.
    """
    for path in sorted(checkpoint.rglob("*.safetensors")):
        _check_safetensors(path)  # never unpickled, but a broken one would fail only mid-load
    files = pickle_files(checkpoint)
    allowed = allowed_globals(deepspeed=any(p.name.endswith("_states.pt") for p in files))
    if not trust:
        for path in files:
            load_file(path, allowed)
        # FSDP's sharded checkpoints (torch.distributed.checkpoint) hold a .metadata file that
        # torch reads with plain pickle.load, outside torch.load's restricted unpickler.
        for path in sorted(checkpoint.rglob(".metadata")):
            if path.stat().st_size > MAX_METADATA_BYTES:
                raise UsageError(f"{path}: {path.stat().st_size} bytes, more than a checkpoint's metadata can need")
            check_dcp_metadata(path.read_bytes(), path)
    rng = checkpoint / RNG_FILE.format(process_index)
    if not rng.is_file():
        raise UsageError(f"{rng}: missing (the RNG states of process {process_index}); the resume would not be exact")
    states = load_file(rng, allowed)  # Accelerate reads it weights-only, trusted or not
    wanted = {"random_state": tuple, "numpy_random_seed": tuple, "torch_manual_seed": torch.Tensor}
    if torch.cuda.is_available():
        wanted["torch_cuda_manual_seed"] = list
    bad = [k for k, kind in wanted.items() if not isinstance(states, dict) or not isinstance(states.get(k), kind)]
    if bad:
        raise UsageError(f"{rng}: not the RNG states this machine restores (missing or invalid: {', '.join(bad)})")
    return states


def check_rng_restored(states: dict[str, Any], checkpoint: Path, process_index: int) -> None:
    """UsageError unless the RNGs now hold `states` (what `read_checkpoint_files` returned)."""
    restored = (
        random.getstate() == states["random_state"]
        and _same_numpy_state(np.random.get_state(), states["numpy_random_seed"])
        and torch.equal(torch.get_rng_state(), states["torch_manual_seed"])
    )
    if restored and torch.cuda.is_available():
        saved = states["torch_cuda_manual_seed"]
        restored = len(saved) <= torch.cuda.device_count() and all(
            torch.equal(torch.cuda.get_rng_state(i), s) for i, s in enumerate(saved)
        )
    if not restored:
        rng = checkpoint / RNG_FILE.format(process_index)
        raise UsageError(f"{rng}: the RNG states were not restored from it; the resume would not be exact")


def _check_safetensors(path: Path) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(path, "pt") as f:  # parses the JSON header only
            f.keys()
    except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{path}: not a valid safetensors file ({one_line(e)})") from None


def _same_numpy_state(a: Any, b: Any) -> bool:
    return len(a) == len(b) and all(
        np.array_equal(x, y) if isinstance(x, np.ndarray) or isinstance(y, np.ndarray) else x == y
        for x, y in zip(a, b, strict=True)
    )
