"""The output directory of one run, owned in one place.

The loop talks to a RunDir only: first the lock (one live run per directory, lock.py), then
the checks before anything is written (what --resume-from means here, whether the directory
holds an earlier run), agreed by every rank so that all nodes stop together with the same
error; then config, metrics, results, checkpoints and the preemption marker, each written by
the process that should write it. A write the storage refuses stops every rank with the same
StorageError. Every node must see the same directory: checkpoints hold one file per rank and
results are written by rank 0 alone, so a directory that is not shared is refused before
training starts.

config.json is the config that ran, `batch_size: auto` settled into the batch it chose: it says
what ran, and `accel-mnist train --config <output-dir>/config.json` runs it again.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from accelerate import Accelerator

from ..caller import setting
from ..config import AUTO_BATCH, TrainConfig
from ..data.catalog import resolve_data_dir
from ..distributed.consensus import agree, gather_ints, seen_by_every_node
from ..errors import UsageError
from ..files import read_json_if_valid, write_json_atomic, writing
from . import checkpoint as ckpt
from . import outputs
from .lock import RunLock

# Settings whose change turns a finished run into another run: auto then does not return it.
_FINISHED_KEYS = (*ckpt.MUST_MATCH, "batch_size", "epochs", "max_steps", "stop_at_accuracy")
_FRESH, _RESUME, _FINISHED = 0, 1, 2
logger = logging.getLogger(__name__)


@dataclass
class Plan:
    """What this start of the command does: resume from `resume`, start fresh, or nothing
    (`finished` holds the results of a run that is already complete)."""

    resume: Path | None = None
    state: dict[str, Any] | None = None  # the checkpoint's trainer_state.json (training/state.py reads it)
    finished: dict[str, Any] | None = None


class RunDir:
    """`config.output_dir` as the loop sees it; a context manager that holds its lock."""

    def __init__(self, accelerator: Accelerator, config: TrainConfig) -> None:
        self.accelerator, self.config = accelerator, config
        self.dir = Path(config.output_dir)
        self.lock = RunLock(self.dir)
        self._created = self._opened = False

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        """Release the lock; a directory this run created and never opened goes too, so that a
        run stopped by a check leaves nothing behind."""
        untouched = self._created and not self._opened
        self.lock.release(remove=untouched)
        if untouched:
            try:
                self.dir.rmdir()  # only if empty: never what someone else put there
            except OSError:
                pass

    # -- before anything is written ---------------------------------------------------------

    def plan(self) -> Plan:
        """Take the directory's lock (main process), then resolve --resume-from and check the
        directory, on every rank; the same answer (or the same UsageError) everywhere, or an
        error saying the ranks see different things."""
        agree(self.accelerator, self._claim)
        plan = agree(self.accelerator, self._plan_here)
        kind = _FINISHED if plan.finished is not None else _RESUME if plan.resume else _FRESH
        step = plan.state.get("step", 0) if plan.state is not None else -1
        seen = gather_ints(self.accelerator, [kind, step])
        if any(row != seen[0] for row in seen):
            views = ", ".join(f"rank {r}: {_describe(*row)}" for r, row in enumerate(seen))
            raise UsageError(
                f"the processes see different runs in {self.dir} ({views}); "
                f"{setting('output_dir')} must be on storage that every node shares"
            )
        return plan

    def _claim(self) -> None:
        """Lock the directory for this run (creating it): a second run into it stops here, and
        so does a directory that cannot be written, before anything is trained."""
        if self.accelerator.is_main_process:
            self._created = not self.dir.exists()
            self.lock.acquire()

    def _plan_here(self) -> Plan:
        config = self.config
        if config.resume_from == "auto" and not config.overwrite and (results := self._finished_results()):
            return Plan(finished=results)
        resume = ckpt.resolve_checkpoint(config.resume_from, self.dir) if config.resume_from else None
        self._check_fresh_start(resuming=resume is not None)
        return Plan(resume=resume, state=ckpt.read_state(resume) if resume else None)

    def _finished_results(self) -> dict[str, Any] | None:
        results = read_json_if_valid(self.dir / outputs.RESULTS_FILE)
        saved = read_json_if_valid(self.dir / outputs.CONFIG_FILE)
        if not isinstance(results, dict) or not isinstance(saved, dict):
            return None
        return results if same_run(saved, results, self.config.to_dict()) else None

    def _check_fresh_start(self, resuming: bool) -> None:
        """Refuse to start afresh over an earlier run's results or checkpoints."""
        results = self.dir / outputs.RESULTS_FILE
        earlier = ckpt.list_checkpoints(self.dir)
        if resuming or self.config.overwrite or not (results.exists() or earlier):
            return
        what = f"a finished run ({outputs.RESULTS_FILE})" if results.exists() else f"checkpoints ({earlier[-1].name})"
        raise UsageError(
            f"{self.dir} already holds {what}; pass {setting('resume_from', 'auto')} to continue it, "
            f"{setting('overwrite', True)} to replace it, or choose another {setting('output_dir')}"
        )

    @contextmanager
    def data_first(self) -> Iterator[None]:
        """The data is read (and downloaded where missing) by one process per copy of the data
        directory first: the main process when every node shares it, else each node's own."""
        data_dir = resolve_data_dir(self.config.data_dir)
        shared = seen_by_every_node(self.accelerator, data_dir)
        if not shared and self.accelerator.is_local_main_process:
            logger.info(f"data directory {data_dir} is not shared by every node: this node reads it on its own")
        first = self.accelerator.main_process_first if shared else self.accelerator.local_main_process_first
        with first():
            yield

    # -- from here on the directory is written ----------------------------------------------

    def open(self, plan: Plan, config: TrainConfig) -> None:
        """Create the directory, check that every node sees it, and clear what this run replaces:
        after a resume, the checkpoints and metrics rows past its step; otherwise all of them. Then
        record `config`, the config the run uses (`batch_size: auto` settled), in config.json and in
        the trackers' (which write under the directory too)."""
        acc = self.accelerator
        self.config = config  # from here on the directory is the settled run's
        resume_step = plan.state.get("step", 0) if plan.state is not None else None

        def create() -> None:
            try:  # on every rank (exist_ok), so that a failure stops them all alike
                with writing("the output directory", self.dir):
                    self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UsageError(f"cannot create output directory {self.dir}: {e.strerror}") from None

        agree(acc, create)
        shared = seen_by_every_node(acc, self.dir)

        def refuse_unshared() -> None:  # raised by rank 0, so that every node prints rank 0's path
            if not shared and acc.is_main_process:
                raise UsageError(
                    f"{setting('output_dir', self.dir)} is not shared by every node (a file written there by rank 0 "
                    "is missing on another node); put it on a filesystem that all nodes mount"
                )

        agree(acc, refuse_unshared)
        self._opened = True

        def clear() -> None:
            if not acc.is_main_process:
                return
            earlier = ckpt.list_checkpoints(self.dir)
            if resume_step is None:  # --overwrite: the earlier run's checkpoints go too
                shutil.rmtree(ckpt.checkpoint_dir(self.dir), ignore_errors=True)
            else:  # checkpoints after the resume point belong to a future that is rewritten
                for later in earlier:
                    if ckpt.step_of(later) > resume_step:
                        shutil.rmtree(later, ignore_errors=True)
            outputs.truncate_metrics(self.dir, resume_step)
            write_json_atomic(self.dir / outputs.CONFIG_FILE, self.config.to_dict())
            (self.dir / outputs.RESULTS_FILE).unlink(missing_ok=True)
            (self.dir / outputs.PREEMPTED_FILE).unlink(missing_ok=True)

        agree(acc, clear)  # also the barrier: no rank writes before the directory is ready
        if config.report_to != "none":
            tracked = {k: "none" if v is None else v for k, v in config.to_dict().items()}
            acc.init_trackers("accel_mnist", config=tracked)

    def _on_main(self, write: Callable[[], object]) -> None:
        """`write()` on the main process; a StorageError there stops every rank alike."""
        agree(self.accelerator, lambda: write() if self.accelerator.is_main_process else None)

    def log_metrics(self, row: dict[str, Any]) -> None:
        """Append one evaluation's metrics (main process)."""
        self._on_main(lambda: outputs.append_metrics(self.dir, row))

    def save_checkpoint(self, state: dict[str, Any]) -> Path:
        """A complete checkpoint of the current step (all ranks)."""
        return ckpt.save_checkpoint(self.accelerator, self.dir, state, self.config.keep_checkpoints)

    def mark_preempted(self, signal_name: str, step: int, checkpoint: Path) -> None:
        """Leave `preempted.json` for a requeue script: the launcher's own exit code is torchrun's."""
        info = {"signal": signal_name, "step": step, "checkpoint": str(checkpoint)}
        self._on_main(lambda: write_json_atomic(self.dir / outputs.PREEMPTED_FILE, info))

    def write_results(self, results: dict[str, Any]) -> None:
        """Write results.json atomically (main process)."""
        self._on_main(lambda: write_json_atomic(self.dir / outputs.RESULTS_FILE, results))


def same_run(saved: dict[str, Any], results: dict[str, Any], now: dict[str, Any]) -> bool:
    """Whether the finished run of `saved` (its config.json) and `results` (its results.json) is the one the
    config `now` asks for, so that `--resume-from auto` returns it. config.json names the batch that ran;
    `batch_size: auto` asks for the batch auto chose, which results.json's `batch_size_auto` says it was (a
    directory written before config.json named the batch saved auto itself, as 0)."""
    chosen_by_auto = results.get("batch_size_auto") is True or saved.get("batch_size") == AUTO_BATCH
    if now["batch_size"] == AUTO_BATCH and chosen_by_auto:
        saved = {**saved, "batch_size": AUTO_BATCH}
        if now.get("global_batch_size") is not None:  # auto chose the accumulation too, to keep this batch
            if results.get("global_batch_size") != now["global_batch_size"]:
                return False
            saved = {**saved, "grad_accum": now["grad_accum"]}
    return all(saved.get(k) == now[k] for k in _FINISHED_KEYS)


def _describe(kind: int, step: int) -> str:
    return {_FRESH: "no checkpoint", _RESUME: f"step_{step}", _FINISHED: "a finished run"}.get(kind, "?")
