"""The memory suites: every strategy's model states per process, measured against predicted, and the peak.

Each row is one `accel-mnist train` launch; what is read is its results.json `memory`
(accel_mnist/memory/memory_watch.py counts the tensors, model_states.py predicts them). The
suite README gets one table: per row the process holding most, its parameters, gradients,
optimizer states and offloaded states measured / predicted, the peak, and the peak's overhead
above the model states on the device (activations, communication buckets, the data on the
device, the allocator's slack; under a CPU's RSS also the interpreter and its libraries, which
the `floor` row measures alone).
"""

from __future__ import annotations

from typing import Any

from accel_mnist.memory.model_states import KINDS

MIB = 1 << 20
# What runner.PARSERS["memory"] reads of a run's results.json, with its `memory`.
FACTS = ("distributed_type", "num_processes", "zero_stage", "mixed_precision", "model", "num_parameters",
         "offload_optimizer", "offload_param", "test_accuracy", "steps")  # fmt: skip


def largest(parsed: dict[str, Any]) -> dict[str, Any]:
    """The per-process record of the process holding the most model states."""
    return max(parsed["memory"]["per_process"], key=lambda r: sum(r[k] for k in KINDS))


def peak(record: dict[str, Any]) -> int | None:
    """The process's peak: allocated on an accelerator, else its RSS."""
    value = record.get("peak_allocated_bytes")
    return value if value is not None else record.get("peak_rss_bytes")


def numbers(parsed: dict[str, Any]) -> str:
    """The row's numbers for the generic suite table."""
    if not parsed.get("memory"):
        return "–"
    top, predicted = largest(parsed), parsed["memory"]["predicted"]
    states = sum(top[k] for k in KINDS)
    return (f"model states {states / MIB:.1f} / {sum(predicted[k] for k in KINDS) / MIB:.1f} MiB "
            f"(measured / predicted), peak {(peak(top) or 0) / MIB:.0f} MiB")  # fmt: skip


def _pair(measured: int, predicted: int) -> str:
    return f"{measured / MIB:.1f} / {predicted / MIB:.1f}"


def readme_section(record: dict[str, Any]) -> list[str]:
    """The memory table of a suite record (no lines where no row was a memory row)."""
    names = {row["name"] for row in record["rows"] if row["parse"] == "memory"}
    runs = [r for r in record["runs"] if r["row"] in names and r["rc"] == 0 and r.get("parsed", {}).get("memory")]
    if not runs:
        return []
    lines = ["", "## memory per process", "",
             "MiB, measured / predicted, of the process that holds the most; the peak is allocated memory on a GPU, "
             "the whole process's RSS on a CPU; overhead = peak - the model states on the device.", "",
             "| row | strategy | processes | precision | parameters | gradients | optimizer states | offloaded | "
             "model states | measured / predicted | peak | overhead |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for run in runs:
        parsed = run["parsed"]
        top, predicted = largest(parsed), parsed["memory"]["predicted"]
        measured_total, predicted_total = sum(top[k] for k in KINDS), sum(predicted[k] for k in KINDS)
        on_device = sum(top[k] for k in KINDS[:3])
        stage = f" ZeRO-{parsed['zero_stage']}" if parsed.get("zero_stage") else ""
        strategy = parsed.get("distributed_type", "?") + stage
        if parsed.get("offload_optimizer", "none") != "none" or parsed.get("offload_param", "none") != "none":
            strategy += " offload"
        cells = [run["row"], strategy, str(parsed.get("num_processes")), str(parsed.get("mixed_precision")),
                 *(_pair(top[k], predicted[k]) for k in KINDS), _pair(measured_total, predicted_total),
                 f"{measured_total / max(predicted_total, 1):.3f}", f"{(peak(top) or 0) / MIB:.0f}",
                 f"{((peak(top) or 0) - on_device) / MIB:.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines
