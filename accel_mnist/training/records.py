"""The rows a run logs and the results it returns: named fields, built in one place each."""

from __future__ import annotations

import platform
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any

# Fields of a metrics row that results.json states in its own terms ("epochs", "steps", and
# every process's peaks under "memory").
_ROW_ONLY = ("epoch", "step", "peak_allocated_bytes", "peak_rss_bytes")


@dataclass
class SetupFacts:
    """What results.json says about a run's setup, settled as the run starts (training/start.py); the
    prewarm's seconds are filled in as it runs, and `changes` holds each way the run differs from what
    its config asked, in the words it printed."""

    model: dict[str, Any]  # the model's and the data's facts (training/inputs.py's RunModel.facts)
    batch_size: int  # per process: the number `batch_size: auto` chose
    # What lets `--resume-from auto` return this finished run to a `batch_size: auto` request
    # (run/directory.py): config.json names the batch alone.
    batch_size_auto: bool
    global_batch_size: int
    strategy: dict[str, Any]  # Strategy.fields()
    data_loader: str
    allocator_settings: dict[str, str]
    probe_seconds: float
    versions: dict[str, str]
    prewarm_seconds: float = 0.0
    prewarm_engine_seconds: float | None = None  # DeepSpeed's throwaway engine, where it ran
    compile_threads: str | None = None  # TORCHINDUCTOR_COMPILE_THREADS, where dynamo is on
    # ema_decay, where the run evaluated (and exports) an average of its weights: the metrics are the average's.
    ema_decay: float | None = None
    changes: list[str] = field(default_factory=list)

    def fields(self) -> dict[str, Any]:
        """The facts as results.json's fields."""
        out = {**self.model, "batch_size": self.batch_size, "batch_size_auto": self.batch_size_auto,
               "global_batch_size": self.global_batch_size, **self.strategy, "data_loader": self.data_loader,
               "allocator_settings": self.allocator_settings, "prewarm_seconds": self.prewarm_seconds,
               "probe_seconds": self.probe_seconds, "versions": self.versions,
               "changes": list(self.changes)}  # fmt: skip
        if self.prewarm_engine_seconds is not None:
            out["prewarm_engine_seconds"] = self.prewarm_engine_seconds
        if self.compile_threads is not None:
            out["compile_threads"] = self.compile_threads
        if self.ema_decay is not None:
            out["ema_decay"] = self.ema_decay
        return out


def metrics_row(
    state: Any, evaluation: dict[str, Any], *, train_loss: float, lr: float, steps_per_epoch: int, num_processes: int
) -> dict[str, Any]:
    """One evaluation's row of metrics.jsonl: where training stands, the test metrics, the rates.

    Rates count every process's samples; the steady rate leaves out each process start's first
    optimizer step, where compilation and optimizer state allocation happen.
    """
    steady_samples = (state.samples - state.warmup_samples) * num_processes
    return {
        "epoch": round(state.step / steps_per_epoch, 4),
        "step": state.step,
        "train_loss": train_loss,
        **evaluation,
        "lr": lr,
        "samples_per_second": state.samples * num_processes / max(state.train_seconds, 1e-9),
        "train_seconds": state.train_seconds,
        "warmup_seconds": state.warmup_seconds,
        "steady_samples_per_second": steady_samples / max(state.train_seconds - state.warmup_seconds, 1e-9),
    }


def results_record(
    state: Any,
    last_row: dict[str, Any],
    confusion_matrix: list[list[int]],
    *,
    steps_per_epoch: int,
    facts: dict[str, Any],
    wall_seconds: float,
) -> dict[str, Any]:
    """results.json: the last evaluation's metrics, the run's totals and the `facts` of its setup
    (model, dataset, strategy, versions...)."""
    return {
        **{k: v for k, v in last_row.items() if k not in _ROW_ONLY},
        "epochs": round(state.step / steps_per_epoch, 4),
        "steps": state.step,
        "train_seconds": state.train_seconds,
        "wall_seconds": wall_seconds,
        "skipped_steps": state.skipped_steps,
        **facts,
        "confusion_matrix": confusion_matrix,
    }


def versions() -> dict[str, str]:
    """Installed versions of Python and the libraries a result depends on, recorded with every
    result so that numbers can be compared later."""
    out = {"python": platform.python_version()}
    for name in ("torch", "accelerate", "deepspeed", "torchvision", "accel-mnist"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not installed"
    return out
