"""Plots and a text summary of finished (or running) runs, from metrics.jsonl and results.json.

    accel-mnist report outputs/cnn                      # redraw outputs/cnn/*.png, print a summary
    accel-mnist report outputs/ddp outputs/zero2 --output compare.png

matplotlib is imported inside the functions that draw, so that `accel-mnist --help` and the
training CLI never pay for it; figures are built as `matplotlib.figure.Figure` objects and
saved through the Agg canvas, without pyplot's global state (safe in any thread, no display).

Beside it in this package: memory.py (the memory part of the report), estimate_command.py (`accel-mnist
estimate`, the model states predicted before any run) and tables.py (the commands' text tables).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..distributed.strategy import Strategy
from ..errors import UsageError
from ..files import read_json_object, save_figure, size_text
from ..run.outputs import METRICS_FILE, RESULTS_FILE, metrics_lines
from .tables import text_table

__all__ = [
    "CURVES_FILE", "CONFUSION_FILE", "load_run", "plot_confusion_matrix", "plot_training_curves",
    "register", "run_label", "summarize", "write_report",
]  # fmt: skip

CURVES_FILE = "training_curves.png"
CONFUSION_FILE = "confusion_matrix.png"
COMPARISON_FILE = "comparison.png"
# The rows are held in memory to be drawn: 64 MiB of metrics.jsonl is some 100,000 evaluations.
MAX_METRICS_BYTES = 64 << 20


def load_run(run_dir: str | os.PathLike) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(metrics rows, results or None) of a run directory; UsageError if it cannot be read."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"run directory {run_dir} does not exist")
    metrics = run_dir / METRICS_FILE
    if not metrics.is_file():
        raise UsageError(f"{run_dir} has no {METRICS_FILE} (not a training output directory?)")
    if metrics.stat().st_size > MAX_METRICS_BYTES:
        raise UsageError(f"{metrics}: larger than {size_text(MAX_METRICS_BYTES)}, more rows than a report draws")
    rows = []
    for number, line in metrics_lines(metrics):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise UsageError(f"{metrics}:{number}: not a JSON line") from None
        if not isinstance(row, dict) or "step" not in row:
            raise UsageError(f"{metrics}:{number}: expected a metrics row with a 'step'")
        rows.append(row)
    if not rows:
        raise UsageError(f"{metrics} has no rows yet (no evaluation has finished)")
    results = None
    results_file = run_dir / RESULTS_FILE
    if results_file.is_file():
        results = read_json_object(results_file)
    return rows, results


def run_label(run_dir: str | os.PathLike, results: dict[str, Any] | None) -> str:
    """'DEEPSPEED ZeRO-2, 2 proc' from results.json; the directory name without one."""
    strategy = Strategy.recorded_in(results or {})
    return strategy.label if strategy is not None else Path(run_dir).name or str(run_dir)


def _strategies(run_dirs: Sequence[Path], results: Sequence[dict[str, Any] | None]) -> list[str]:
    # Each run's run_label: the tables' strategy column, beside the run's own column.
    return [run_label(d, r) for d, r in zip(run_dirs, results, strict=True)]


def _labels(run_dirs: Sequence[Path], results: Sequence[dict[str, Any] | None]) -> list[str]:
    labels = _strategies(run_dirs, results)
    # Two runs of the same strategy (different models, seeds...) must stay apart in a legend.
    return [
        f"{label} [{d.name}]" if labels.count(label) > 1 and label != d.name else label
        for label, d in zip(labels, run_dirs, strict=True)
    ]


def plot_training_curves(run_dirs: Sequence[str | os.PathLike], out_png: str | os.PathLike) -> Path:
    """Train loss, test loss and test accuracy against the optimizer step, one curve per run."""
    from matplotlib.figure import Figure

    dirs = [Path(d) for d in run_dirs]
    if not dirs:
        raise UsageError("no run directories given")
    runs = [load_run(d) for d in dirs]
    labels = _labels(dirs, [results for _, results in runs])
    fig = Figure(figsize=(15, 4.5), layout="constrained")
    axes = fig.subplots(1, 3)
    panels = [("train_loss", "train loss"), ("test_loss", "test loss"), ("test_accuracy", "test accuracy")]
    for ax, (key, title) in zip(axes, panels, strict=True):
        for (rows, _), label in zip(runs, labels, strict=True):
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                steps, values = zip(*points, strict=True)
                # Markers: a run with a single evaluation is a point, not an invisible line.
                ax.plot(steps, values, marker="o", markersize=3, label=label)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(True, alpha=0.3)
    axes[2].legend(fontsize="small", loc="lower right")
    return save_figure(fig, out_png)


def plot_confusion_matrix(
    matrix: Sequence[Sequence[int]], classes: Sequence[str], out_png: str | os.PathLike, title: str | None = None
) -> Path:
    """Counts in each cell (rows: true class, columns: predicted), coloured by the row's share;
    beyond 30 classes the colours alone (the counts would not fit)."""
    import numpy as np
    from matplotlib.figure import Figure

    counts = np.asarray(matrix, dtype=np.int64)
    if counts.ndim != 2 or counts.shape[0] != counts.shape[1] or counts.shape[0] != len(classes):
        raise UsageError(f"confusion matrix of shape {counts.shape} does not match {len(classes)} classes")
    totals = counts.sum(axis=1, keepdims=True)
    shares = counts / np.maximum(totals, 1)
    n = len(classes)
    cell = 0.7 if n <= 12 else max(0.3, 9.0 / n)  # inches: 10 classes 8 in wide, 47 about 15
    fig = Figure(figsize=(1.5 + cell * n, 1.0 + cell * n), layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(shares, cmap="Blues", vmin=0.0, vmax=1.0)
    fig.colorbar(image, ax=ax, label="share of the true class")
    for i in range(n if n <= 30 else 0):
        for j in range(n):
            ax.text(j, i, str(counts[i, j]), ha="center", va="center", fontsize=8 if n <= 12 else 5,
                    color="white" if shares[i, j] > 0.5 else "black")  # fmt: skip
    small: dict[str, Any] = {} if n <= 12 else {"fontsize": 6}
    rotation = 45 if max(map(len, classes)) > 2 else 0
    ax.set_xticks(range(n), labels=list(classes), rotation=rotation, ha="right" if rotation else "center", **small)
    ax.set_yticks(range(n), labels=list(classes), **small)
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    total = int(counts.sum())
    accuracy = float(np.trace(counts)) / total if total else math.nan
    ax.set_title(title or f"accuracy {accuracy:.4f} on {total} samples")
    return save_figure(fig, out_png)


def _classes(results: dict[str, Any]) -> list[str]:
    """The class names results.json records (older runs: the dataset's own), else 0..N-1."""
    names, n = results.get("class_names"), len(results["confusion_matrix"])
    if isinstance(names, list) and len(names) == n:
        return [str(name) for name in names]  # and the drawing process need not import torch
    from ..data.catalog import DATASETS

    spec = DATASETS.get(str(results.get("dataset", "")))
    return list(spec.classes) if spec else [str(d) for d in range(n)]


def write_report(run_dir: str | os.PathLike) -> list[Path]:
    """Write training_curves.png and (with results.json) confusion_matrix.png into `run_dir`."""
    run_dir = Path(run_dir)
    _, results = load_run(run_dir)
    written = [plot_training_curves([run_dir], run_dir / CURVES_FILE)]
    if results and results.get("confusion_matrix"):
        title = f"{run_label(run_dir, results)}: test accuracy {results.get('test_accuracy', math.nan):.4f}"
        written.append(plot_confusion_matrix(results["confusion_matrix"], _classes(results),
                                             run_dir / CONFUSION_FILE, title=title))  # fmt: skip
    return written


_DRAWING: list[subprocess.Popen[bytes]] = []


def draw_in_background(run_dir: str | os.PathLike) -> subprocess.Popen[bytes]:
    """Start write_report(run_dir) in a process of its own and return at once.

    Importing matplotlib and drawing both PNGs takes longer than the rest of a short run beyond its
    imports (measured: docs/measurements.md#report__init__py); the PNGs appear a moment after
    train() returns (and after the command exits). wait_for_plots() waits for them; `accel-mnist
    report RUN` redraws.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "accel_mnist.report", str(run_dir)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,  # not stopped with the launcher's process group at the end
    )  # fmt: skip
    _DRAWING.append(process)
    return process


def wait_for_plots(timeout: float | None = None) -> None:
    """Wait for the PNGs that draw_in_background started in this process."""
    while _DRAWING:
        _DRAWING.pop().wait(timeout)


def _fmt(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def summarize(run_dirs: Sequence[str | os.PathLike]) -> str:
    """A text table: one line per run with its steps, time, throughput and final test metrics.

    A run without results.json (still running, or killed) shows its last metrics row.
    """
    dirs = [Path(d) for d in run_dirs]
    runs = [load_run(d) for d in dirs]
    labels = _strategies(dirs, [results for _, results in runs])  # the run column tells two alike apart
    header = ("run", "strategy", "steps", "train_seconds", "samples/s", "test_accuracy", "test_loss")
    table = [header]
    for d, label, (rows, results) in zip(dirs, labels, runs, strict=True):
        last = {**rows[-1], **(results or {})}
        table.append((
            str(d), label if results else f"{label} (no {RESULTS_FILE})",
            _fmt(last.get("steps", last.get("step")), "d"), _fmt(last.get("train_seconds"), ".1f"),
            _fmt(last.get("samples_per_second"), ".0f"), _fmt(last.get("test_accuracy"), ".4f"),
            _fmt(last.get("test_loss"), ".4f"),
        ))  # fmt: skip
    return text_table(table, left=2)


def _report(args: argparse.Namespace) -> int:
    dirs = [Path(d) for d in args.run_dirs]
    for d in dirs:
        load_run(d)  # every directory checked before anything is drawn
    written: list[Path] = []
    for d in dirs:
        written += write_report(d)
    if args.output or len(dirs) > 1:
        written.append(plot_training_curves(dirs, args.output or COMPARISON_FILE))
    from .memory import memory_table, write_memory_charts

    results = [load_run(d)[1] for d in dirs]
    labels = _labels(dirs, results)
    written += write_memory_charts(dirs, labels, results)
    print(summarize(dirs))
    if table := memory_table([str(d) for d in dirs], _strategies(dirs, results), results):
        print(table)
    for path in written:
        print(f"wrote {path}")
    return 0


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add `report DIR [DIR...] [--output PNG]` to the CLI's subparsers (handler: args.handler)."""
    parser = subparsers.add_parser(
        "report", help="plot training curves and confusion matrices of runs, and summarise them",
        description="Redraw DIR/training_curves.png and DIR/confusion_matrix.png of each run from its "
        f"{METRICS_FILE} and {RESULTS_FILE}, and print a summary table. With several runs (or --output), "
        "their curves are also drawn together in one PNG.",
    )  # fmt: skip
    parser.add_argument("run_dirs", nargs="+", metavar="DIR", help="a training --output-dir")
    parser.add_argument("--output", metavar="PNG",
                        help="the curves of all the runs together "
                             f"(default with several runs: ./{COMPARISON_FILE})")  # fmt: skip
    parser.set_defaults(handler=_report)
    return parser
