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
from pathlib import Path
from typing import Any

from accelerate import Accelerator

from ..caller import setting
from ..distributed.consensus import agree
from ..distributed.strategy import Strategy
from ..errors import StorageError, UsageError, on_every_rank, one_line
from ..files import read_json_object, write_json_atomic, writing

CHECKPOINTS = "checkpoints"
STATE_FILE = "trainer_state.json"
_NAME = re.compile(r"^step_(\d+)$")
# Keys whose change makes a checkpoint mean something else; everything else may differ on resume.
# The batch size may change with the number of processes as long as the global batch stays.
MUST_MATCH = ("model", "mlp_hidden", "dataset", "grad_accum", "optimizer", "scheduler", "seed", "ema_decay")


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


def save_checkpoint(accelerator: Accelerator, output_dir: str | Path, state: dict[str, Any], keep: int) -> Path:
    """Save on all ranks (DeepSpeed shards are written by each), publish atomically, keep `keep`.
    `state`: trainer_state.json's object (training/state.py), with the step it was saved at.

    Where the storage refuses a write (full, quota, read-only...), every rank raises the same
    StorageError, the partial checkpoint is removed and the previous ones stay as they were.
    """
    root = checkpoint_dir(output_dir)
    step = state["step"]
    final = root / f"step_{step}"
    tmp = root / f".tmp_step_{step}"
    what = f"checkpoint step_{step}"
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
            write_json_atomic(tmp / STATE_FILE, state)

    try:
        agree(accelerator, start)
        agree(accelerator, write)
    except StorageError as e:
        if accelerator.is_main_process:  # every rank has stopped writing into it
            shutil.rmtree(tmp, ignore_errors=True)
        again = setting("resume_from", "auto", again=True)
        kept = (f"{previous[-1].name} is kept, and once the storage takes writes again {again} continues from it"
                if previous else "there is no earlier checkpoint")  # fmt: skip
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
            where = checkpoint_dir(output_dir)
            raise UsageError(f"{setting('resume_from', 'latest')}: no complete checkpoint in {where}")
        return found[-1]
    path = Path(resume_from)
    if not path.is_dir():
        raise UsageError(f"{setting('resume_from', path)}: no such checkpoint folder")
    if not (path / STATE_FILE).is_file():
        raise UsageError(f"{path}: not a complete checkpoint ({STATE_FILE} is missing)")
    return path


def read_state(path: Path) -> dict[str, Any]:
    """The trainer_state.json object of checkpoint folder `path` (training/state.py reads its fields;
    each left out takes its default, as a step of 0); a one-line error where it is unreadable."""
    state = read_json_object(path / STATE_FILE)
    if not isinstance(state.get("step", 0), int) or not isinstance(state.get("strategy", {}), dict):
        raise UsageError(f"{path / STATE_FILE}: unreadable checkpoint state (a step that is no integer, or a "
                         "strategy that is no object)")  # fmt: skip
    return state


def verify_checkpoint(accelerator: Accelerator, path: Path, trust: bool = False) -> dict[str, Any]:
    """Check checkpoint `path` before anything is loaded or written (all ranks); return this rank's RNG states.

    Unless `trust`, every pickle in it must pass torch's restricted unpickler with the few
    classes it needs (safe_load.py); its RNG file must be whole whatever `trust` says. A rank the
    checkpoint's run did not have (a resume on more processes) has none: it keeps the seed it
    started with. Every rank raises the same error, so that none waits in a collective for one
    that stopped.
    """
    from .safe_load import read_checkpoint_files

    saved = read_state(path).get("strategy", {}).get("num_processes", 1)
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

    universal = Strategy.of(accelerator).loads_universal(Strategy.from_fields(read_state(path).get("strategy", {})))
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
