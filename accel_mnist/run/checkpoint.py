"""Checkpoints that appear whole or not at all, and the state needed to resume exactly.

Layout: `<output_dir>/checkpoints/step_<N>/` holds what `accelerator.save_state` wrote (model,
optimizer, scheduler, RNG states; DeepSpeed engines write their own shards) plus
`trainer_state.json` (position in training, per-rank loss sums, resolved config, strategy).
Each checkpoint is written under a hidden temporary name and renamed once complete, so a
crash mid-save leaves the previous checkpoint as the one `latest` finds.
"""

from __future__ import annotations

import pickle
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from ..distributed.consensus import agree
from ..distributed.strategy import Strategy
from ..errors import StorageError, UsageError, on_every_rank, one_line
from ..files import read_json_object, write_json_atomic, writing

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step_(\d+)$")
# Keys whose change makes a checkpoint mean something else; everything else may differ on resume.
# The batch size may change with the number of processes as long as the global batch stays.
MUST_MATCH = ("model", "mlp_hidden", "dataset", "grad_accum", "optimizer", "scheduler", "seed")


@dataclass
class TrainState:
    """Where training stands: enough to continue at the exact next batch."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epoch in progress (0-based)
    batches_in_epoch: int = 0  # micro-batches of that epoch already consumed on each process
    samples: int = 0  # training samples seen by each process
    train_seconds: float = 0.0
    # The first optimizer step of each process start (compilation, optimizer state), included
    # in train_seconds and timed apart, so that a steady rate can leave it out.
    warmup_seconds: float = 0.0
    warmup_samples: int = 0
    loss_sums: list[float] = field(default_factory=list)  # per rank, since the last evaluation
    loss_count: int = 0
    skipped_steps: int = 0
    total_steps: int = 0  # what onecycle/cosine were sized for
    strategy: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)
    # What `accel-mnist export` needs to rebuild the model: the registry name (or the class
    # name of a user's module), the normalisation and the data it was trained with, and a
    # transformers model's config.json.
    model: str = ""
    mean: float = 0.0
    std: float = 1.0
    dataset: str = ""  # the config's, or a label for data passed to train()
    num_classes: int = 10
    class_names: list[str] | None = None
    input_shape: list[int] = field(default_factory=lambda: [1, 28, 28])
    train_samples: int = 0  # 0: not recorded (older checkpoints)
    transformers_config: dict[str, Any] | None = None


def checkpoint_dir(output_dir: str | Path) -> Path:
    """Where a run's checkpoints live."""
    return Path(output_dir) / CHECKPOINTS


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (temporary and foreign folders are ignored)."""
    root = checkpoint_dir(output_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()]
    return [p for _, p in sorted(found)]


def step_of(path: Path) -> int:
    """The step number in a checkpoint folder's name (step_<N>)."""
    m = _NAME.match(path.name)
    return int(m.group(1)) if m else -1


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, state: TrainState, keep: int) -> Path:
    """Save on all ranks (DeepSpeed shards are written by each), publish atomically, keep `keep`.

    Where the storage refuses a write (full, quota, read-only...), every rank raises the same
    StorageError, the partial checkpoint is removed and the previous ones stay as they were.
    """
    root = checkpoint_dir(output_dir)
    final = root / f"step_{state.step}"
    tmp = root / f".tmp_step_{state.step}"
    what = f"checkpoint step_{state.step}"
    previous = list_checkpoints(output_dir)

    def start() -> None:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            with writing(what, tmp):
                tmp.mkdir(parents=True)

    def write() -> None:
        with writing(what, tmp):
            accelerator.save_state(str(tmp))
        if accelerator.is_main_process:  # after every rank's files: the barrier is agree's gather
            # Written last: a folder without it is incomplete even if someone renames it by hand.
            write_json_atomic(tmp / STATE_FILE, asdict(state))

    try:
        agree(accelerator, start)
        agree(accelerator, write)
    except StorageError as e:
        if accelerator.is_main_process:  # every rank has stopped writing into it
            shutil.rmtree(tmp, ignore_errors=True)
        kept = (f"{previous[-1].name} is kept, and once the storage takes writes again the same command with "
                f"--resume-from auto continues from it") if previous else "there is no earlier checkpoint"  # fmt: skip
        raise on_every_rank(StorageError(f"{e}; the partial checkpoint was removed; {kept}")) from e
    if accelerator.is_main_process:
        if final.exists():
            shutil.rmtree(final)
        tmp.rename(final)
        for old in list_checkpoints(output_dir)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        for stale in [*root.glob(".tmp_step_*"), *root.glob(".universal_step_*")]:  # left by crashed saves, loads
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    return final


def resolve_checkpoint(resume_from: str, output_dir: str | Path) -> Path | None:
    """`latest` (in output_dir), `auto` (latest if any, else None: a fresh start) or a path to a
    checkpoint folder; a clear error otherwise."""
    if resume_from in ("latest", "auto"):
        found = list_checkpoints(output_dir)
        if not found and resume_from == "auto":
            return None
        if not found:
            raise UsageError(f"--resume-from latest: no complete checkpoint in {checkpoint_dir(output_dir)}")
        return found[-1]
    path = Path(resume_from)
    if not path.is_dir():
        raise UsageError(f"--resume-from {path}: no such checkpoint folder")
    if not (path / STATE_FILE).is_file():
        raise UsageError(f"{path}: not a complete checkpoint ({STATE_FILE} is missing)")
    return path


def read_state(path: Path) -> TrainState:
    """The TrainState saved in checkpoint folder `path`; a one-line error if unreadable."""
    try:
        return TrainState(**read_json_object(path / STATE_FILE))
    except TypeError as e:
        raise UsageError(f"{path / STATE_FILE}: unreadable checkpoint state ({e})") from None


def check_compatible(
    saved: TrainState, strategy: Strategy, config: dict[str, Any], path: Path, total_steps: int,
    data: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Refuse to resume into a run that would silently mean something else (`data`: this run's
    TrainState fields of its data, num_classes, class_names, input_shape, train_samples)."""
    if saved.step >= total_steps:
        raise UsageError(f"{path} is already at step {saved.step} of {total_steps}: nothing left to train")
    if config.get("scheduler") in ("onecycle", "cosine") and saved.total_steps not in (0, total_steps):
        raise UsageError(
            f"{path} was saved with a {config['scheduler']} schedule over {saved.total_steps} steps but this run "
            f"has {total_steps}; keep --epochs/--max-steps as they were (or use --scheduler none or step)"
        )
    strategy.check_resume(Strategy.from_fields(saved.strategy), path, saved.config, config)
    for key in MUST_MATCH:
        if saved.config.get(key) != config.get(key):
            raise UsageError(
                f"{path} was saved with {key}={saved.config.get(key)!r} but this run has {key}={config.get(key)!r}"
            )
    for key, now in (data or {}).items():
        was = getattr(saved, key)
        unrecorded = (key == "train_samples" and not was) or (key == "class_names" and was is None)
        if not unrecorded and was != now:
            raise UsageError(f"{path} was trained on data with {key}={was!r} but this run's data has {now!r}")


def rescale_loss_sums(state: TrainState, num_processes: int) -> list[float]:
    """Per-rank loss sums of the checkpoint for `num_processes` ranks.

    Each rank sums its batches' mean losses and the train loss divides the total by the
    number of ranks, so the total scales with the number of ranks; rank 0 carries it.
    """
    sums = state.loss_sums
    if not sums or len(sums) == num_processes:
        return sums or [0.0] * num_processes
    total = sum(sums) * num_processes / len(sums)
    return [total] + [0.0] * (num_processes - 1)


def verify_checkpoint(accelerator: Accelerator, path: Path, trust: bool = False) -> dict[str, Any]:
    """Check checkpoint `path` before anything is loaded or written (all ranks); return this rank's RNG states.

    Unless `trust`, every pickle in it must pass torch's restricted unpickler with the few
    classes it needs (safe_load.py); its RNG file must be whole whatever `trust` says. A rank the
    checkpoint's run did not have (a resume on more processes) has none: it keeps the seed it
    started with. Every rank raises the same error, so that none waits in a collective for one
    that stopped.
    """
    from .safe_load import read_checkpoint_files

    saved = read_state(path).strategy.get("num_processes", 1)
    rank = accelerator.process_index
    return agree(accelerator, lambda: read_checkpoint_files(path, rank, trust) if rank < saved else {})


def load_checkpoint(accelerator: Accelerator, path: Path, rng_states: dict[str, Any], trust: bool = False) -> None:
    """Restore model, optimizer, scheduler and RNG states (all ranks) from a verified checkpoint.

    Unless `trust`, `load_state` runs with the restricted unpickler forced on every torch.load,
    DeepSpeed's `weights_only=False` ones included. The RNG states must come back as
    `verify_checkpoint` read them: Accelerate would skip them with a log line. ZeRO shards of
    another number of processes are loaded through DeepSpeed's universal format (universal.py).
    """
    from . import universal as uc
    from .safe_load import check_rng_restored, refusal, weights_only_loads

    universal = Strategy.of(accelerator).loads_universal(Strategy.from_fields(read_state(path).strategy))
    ours = checkpoint_dir(accelerator.project_dir or path.parent.parent)  # project_dir: the output directory
    source = uc.convert(accelerator, path, ours, trust) if universal else path

    def load() -> None:
        from safetensors import SafetensorError

        try:
            if trust:  # Accelerate's own loads default to weights_only=True
                accelerator.load_state(str(source), load_kwargs={"weights_only": False})
            else:
                with weights_only_loads():
                    accelerator.load_state(str(source))
        except pickle.UnpicklingError as e:
            what = refusal(e) or "object"
            raise UsageError(f"{path}: refused a pickled {what} while loading (changed after the check?)") from None
        except (FileNotFoundError, KeyError, RuntimeError, ValueError, SafetensorError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UsageError(f"{path}: cannot load checkpoint: {one_line(first)}") from None
        if rng_states:
            check_rng_restored(rng_states, path, accelerator.process_index)

    try:
        agree(accelerator, load)
    finally:
        if universal:
            uc.remove(accelerator, path, ours)
