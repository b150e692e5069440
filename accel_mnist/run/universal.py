"""Resuming a ZeRO checkpoint on another number of processes, through DeepSpeed's universal
checkpoints.

A ZeRO checkpoint holds each process's shard of the optimizer state, so DeepSpeed loads it only
on the number of processes that wrote it. Its converter, `ds_to_universal`, rewrites the shards
per parameter (fp32 weights, Adam moments, step count), and an engine whose config says
`checkpoint.load_universal` partitions them anew for its own processes. Accelerate's
checkpoints lack the `universal_checkpoint_info` the converter asks for (DeepSpeed#5430); its
`inject_missing_state` option supplies the defaults, which hold where there is data parallelism
alone (no tensor or pipeline parallelism): all accel_mnist runs.

The conversion goes to a hidden folder among the run's own checkpoints, `.universal_step_N`,
laid out as `load_state` reads it (DeepSpeed's universal `pytorch_model/` and links to the
checkpoint's other files), and is removed once loaded; the checkpoint itself, which may be
someone else's (`--resume-from PATH`), is only read.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import os
import pickle
import shutil
from pathlib import Path

from accelerate import Accelerator

from ..distributed.consensus import agree
from ..errors import UsageError, one_line
from ..files import writing

MODEL_FOLDER = "pytorch_model"  # where Accelerate's save_state has DeepSpeed write the first model
logger = logging.getLogger(__name__)


def universal_folder(checkpoint: Path, checkpoints: Path) -> Path:
    """Where the universal conversion of `checkpoint` is written, in this run's `checkpoints` folder."""
    return checkpoints / f".universal_{checkpoint.name}"


def convert(accelerator: Accelerator, checkpoint: Path, checkpoints: Path, trust: bool) -> Path:
    """Write the universal conversion of ZeRO checkpoint `checkpoint` into this run's `checkpoints`
    folder (main process; every rank returns once it is there) and return the folder it is in,
    which `accelerator.load_state` reads."""
    out = universal_folder(checkpoint, checkpoints)

    def write() -> None:
        if not accelerator.is_main_process:
            return
        shutil.rmtree(out, ignore_errors=True)
        with writing("the universal checkpoint", out):
            out.mkdir(parents=True)
            _run_converter(checkpoint / MODEL_FOLDER, out / MODEL_FOLDER, trust)
            for item in checkpoint.iterdir():  # Accelerate's own files: scheduler, RNG states, ...
                if item.name != MODEL_FOLDER:
                    os.symlink(item.resolve(), out / item.name)

    agree(accelerator, write)
    return out


def remove(accelerator: Accelerator, checkpoint: Path, checkpoints: Path) -> None:
    """Remove the conversion once every rank has loaded it."""
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(universal_folder(checkpoint, checkpoints), ignore_errors=True)


def _run_converter(source: Path, target: Path, trust: bool) -> None:
    from deepspeed.checkpoint import ds_to_universal

    from .safe_load import refusal, weights_only_loads

    args = argparse.Namespace(
        input_folder=str(source), output_folder=str(target), num_extract_workers=1, num_merge_workers=1,
        keep_temp_folder=False, strict=True, inject_missing_state=True,
    )  # fmt: skip
    printed = io.StringIO()  # its progress lines and bars: for --log-level debug only
    guard = weights_only_loads() if not trust else contextlib.nullcontext()
    try:
        # One worker: no process pool, so that the restricted unpickler covers every load (the
        # converter reads the shards with weights_only=False).
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed), guard:
            ds_to_universal.main(args)
    except pickle.UnpicklingError as e:
        what = refusal(e) or "object"
        raise UsageError(f"{source}: refused a pickled {what} while converting it") from None
    except (AssertionError, KeyError, ValueError, RuntimeError, FileNotFoundError) as e:
        raise UsageError(
            f"{source.parent}: DeepSpeed's ds_to_universal cannot convert it for another number of processes "
            f"({one_line(e) or type(e).__name__}); resume with the number of processes it was saved with"
        ) from None
    logger.debug(printed.getvalue())
