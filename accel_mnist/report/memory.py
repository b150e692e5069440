"""The memory part of `accel-mnist report`: a table of every run's model states and peaks, and a chart per run.

Read from results.json's `memory` (memory/memory_watch.py writes it): each process's parameters,
gradients, optimizer states and offloaded states, measured beside predicted, and its peaks.
matplotlib is imported inside the drawing function only; nothing here imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..files import save_figure
from ..memory.model_states import KINDS, NAMES
from .tables import text_table

MEMORY_FILE = "memory.png"
MIB = 1 << 20


def memory_of(results: dict[str, Any] | None) -> dict[str, Any] | None:
    """results.json's `memory`, where it has the shape a run writes; None otherwise (an older run)."""
    memory = (results or {}).get("memory")
    if not isinstance(memory, dict) or not isinstance(memory.get("per_process"), list):
        return None
    rows, predicted = memory["per_process"], memory.get("predicted")
    fields = (*KINDS, "rank")
    if not rows or not isinstance(predicted, dict) or not all(isinstance(predicted.get(k), int) for k in KINDS):
        return None
    if not all(isinstance(r, dict) and all(isinstance(r.get(k), int) for k in fields) for r in rows):
        return None
    return memory


def _mib(value: Any) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value / MIB:.1f}"


def memory_table(runs: Sequence[str], strategies: Sequence[str], results: Sequence[dict[str, Any] | None]) -> str:
    """One line per process of every run with a `memory`: measured/predicted MiB by kind, and the peaks.

    A line names its run (the directory, as the summary does) and the run's strategy beside it:
    two runs of one strategy differ by model, batch or seed, and must stay apart.
    """
    header = ("run", "strategy", "rank", *NAMES, "model states", "peak allocated", "peak reserved", "peak RSS")
    table: list[tuple[str, ...]] = [header]
    for run, strategy, result in zip(runs, strategies, results, strict=True):
        memory = memory_of(result)
        if memory is None:
            continue
        predicted = memory["predicted"]
        for row in memory["per_process"]:
            pairs = [f"{_mib(row[k])} / {_mib(predicted[k])}" for k in KINDS]
            total = f"{_mib(sum(row[k] for k in KINDS))} / {_mib(sum(predicted[k] for k in KINDS))}"
            peaks = [_mib(row.get(k)) for k in ("peak_allocated_bytes", "peak_reserved_bytes", "peak_rss_bytes")]
            if predicted.get("peak_allocated_bytes"):  # on a GPU: the predicted peak beside the measured
                peaks[0] += f" / {_mib(predicted['peak_allocated_bytes'])}"
            table.append((run, strategy, str(row["rank"]), *pairs, total, *peaks))
    if len(table) == 1:
        return ""
    return "memory per process, MiB (measured / predicted):\n" + text_table(table, left=2)


def plot_memory(results: dict[str, Any], title: str, out_png: str | os.PathLike) -> Path:
    """Per process: the model states by kind, measured beside predicted; and the peak, split into
    those model states and the rest (activations, buckets, data, the allocator's slack; the
    interpreter and libraries too where the peak is a CPU's RSS)."""
    from matplotlib.figure import Figure

    memory = memory_of(results)
    if memory is None:
        raise ValueError("results without a memory record")
    rows, predicted = memory["per_process"], memory["predicted"]
    fig = Figure(figsize=(max(8.0, 2.4 * len(rows) + 4), 4.5), layout="constrained")
    states_ax, peak_ax = fig.subplots(1, 2)
    width, ranks = 0.38, range(len(rows))
    for i, row in enumerate(rows):
        for offset, values, hatch in ((-width / 2, row, None), (width / 2, predicted, "//")):
            bottom = 0.0
            for k, (kind, name) in enumerate(zip(KINDS, NAMES, strict=True)):
                label = name if i == 0 and hatch is None else None
                states_ax.bar(i + offset, values[kind] / MIB, width, bottom=bottom, color=f"C{k}", hatch=hatch,
                              label=label, edgecolor="white")  # fmt: skip
                bottom += values[kind] / MIB
    states_ax.set_xticks(ranks, labels=[f"rank {r['rank']}\nmeasured | predicted" for r in rows])
    states_ax.set_title("model states")
    tallest = max(sum(values[k] for k in KINDS) for values in (*rows, predicted)) / MIB
    states_ax.set_ylim(0, 1.45 * tallest or 1.0)  # room for the legend above the bars
    allocated = all(isinstance(r.get("peak_allocated_bytes"), int) for r in rows)
    key = "peak_allocated_bytes" if allocated else "peak_rss_bytes"
    states = [sum(r[k] for k in KINDS[:3]) / MIB for r in rows]  # what lives on the device
    peaks = [(r.get(key) or 0) / MIB for r in rows]
    peak_ax.bar(ranks, states, color="C0", label="model states on the device")
    peak_ax.bar(ranks, [max(p - s, 0.0) for p, s in zip(peaks, states, strict=True)], bottom=states, color="0.7",
                label="the rest of the peak")  # fmt: skip
    expected = predicted.get("peak_allocated_bytes") if allocated else None
    if expected:  # one prediction per run: what each process should reach
        peak_ax.axhline(expected / MIB, color="C3", linestyle="--", linewidth=1, label="predicted peak")
        peaks.append(expected / MIB)
    peak_ax.set_ylim(0, 1.3 * max(peaks + states) or 1.0)
    peak_ax.set_xticks(ranks, labels=[f"rank {r['rank']}" for r in rows])
    peak_ax.set_title("peak allocated" if allocated else "peak RSS (the whole process)")
    for ax, columns in ((states_ax, 2), (peak_ax, 1)):
        ax.set_ylabel("MiB")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize="small", loc="upper left", ncols=columns)
    fig.suptitle(title)
    return save_figure(fig, out_png)


def write_memory_charts(run_dirs: Sequence[Path], labels: Sequence[str], results: Sequence[Any]) -> list[Path]:
    """DIR/memory.png for every run whose results.json has a `memory`."""
    written = []
    for run_dir, label, result in zip(run_dirs, labels, results, strict=True):
        if memory_of(result) is not None:
            model = f"{result.get('model', '?')}, {result.get('num_parameters', 0):,} parameters"
            written.append(plot_memory(result, f"{label}: {model}", run_dir / MEMORY_FILE))
    return written
