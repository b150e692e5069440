"""Shared pieces of the benchmark scripts: hardware/version facts and result files.

Every run writes `<out>/<bench>-<UTC stamp>-<tag>.json` (the whole record) and appends one
row to `<out>/<bench>.md` (a markdown table, header written on first use).
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
CONFIGS = REPO / "accelerate_configs"
DEFAULT_MNIST = REPO.parent / "shared" / "data" / "mnist"


def data_dir() -> str:
    """$ACCEL_MNIST_DATA_DIR, else ../shared/data/mnist beside the repo, else ./data."""
    env = os.environ.get("ACCEL_MNIST_DATA_DIR")
    if env:
        return env
    if (DEFAULT_MNIST / "train-images-idx3-ubyte.gz").is_file():
        return str(DEFAULT_MNIST)
    return "data"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": None,
        "gpu_count": 0,
        # Other work on the machine skews CPU timings; keep the load beside them.
        "loadavg_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
    }
    if torch.cuda.is_available():
        info["gpu_count"] = torch.cuda.device_count()
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def hardware_label(hw: dict[str, Any]) -> str:
    if hw.get("gpu_count"):
        return f"{hw['gpu_count']}x {hw['gpu']}"
    return f"CPU: {hw['cpu']} ({hw['cpu_cores']} cores, {hw['torch_threads']} threads)"


def versions() -> dict[str, str]:
    from accel_mnist.versions import versions as _versions

    return _versions()


def default_out_dir(hw: dict[str, Any]) -> Path:
    """results/<hardware>-<UTC date>/: one folder per machine and day, never the top level."""
    if hw.get("gpu_count"):
        name = f"{str(hw['gpu']).split()[-1].lower()}x{hw['gpu_count']}"
    else:
        name = f"cpu{hw.get('cpu_cores') or ''}"
    return RESULTS / f"{name}-{utc_now()[:10]}"


def command_line(argv: Sequence[str] | None = None) -> str:
    argv = sys.argv if argv is None else argv
    return shlex.join([Path(sys.executable).name, *argv])


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")[:80] or "run"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        if value == 0 or 0.01 <= abs(value) < 1e6:
            return f"{value:.4g}" if abs(value) < 10 else f"{value:,.1f}"
        return f"{value:.3g}"
    if value is None:
        return "–"
    return str(value).replace("|", "\\|")


def record_result(bench: str, tag: str, record: dict[str, Any], columns: Sequence[str],
                  out: str | os.PathLike | None = None) -> Path:  # fmt: skip
    """Write the JSON record and append a markdown row of `columns` (keys of record, dotted for nesting)."""
    record.setdefault("benchmark", bench)
    hw = record.setdefault("hardware", hardware())
    out_dir = Path(out) if out else default_out_dir(hw)
    out_dir.mkdir(parents=True, exist_ok=True)
    record.setdefault("versions", versions())
    record.setdefault("date", utc_now())
    record.setdefault("command", command_line())
    record.setdefault("hardware_label", hardware_label(hw))
    record["table_columns"] = list(columns)
    stamp = record["date"].replace(":", "").replace("-", "")
    path = out_dir / f"{bench}-{stamp}-{_slug(tag)}.json"
    n = 1
    while path.exists():
        n += 1
        path = out_dir / f"{bench}-{stamp}-{_slug(tag)}-{n}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")

    table = out_dir / f"{bench}.md"
    if not table.exists():
        table.write_text(table_header(bench, columns))
    with open(table, "a") as f:
        f.write(table_row(record, columns))
    print(f"[{bench}] wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}", file=sys.stderr)
    return path


def _get(record: dict[str, Any], key: str) -> Any:
    value: Any = record
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def table_header(bench: str, columns: Sequence[str]) -> str:
    header = ["date", "hardware", *columns, "versions", "command"]
    return f"# {bench}\n\n| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n"


def table_row(record: dict[str, Any], columns: Sequence[str]) -> str:
    v = record.get("versions", {})
    row = [record["date"], record["hardware_label"],
           *(f"`{_get(record, c)}`" if c.endswith("command") and _get(record, c) else _cell(_get(record, c))
             for c in columns),
           f"torch {v.get('torch')}, accelerate {v.get('accelerate')}, deepspeed {v.get('deepspeed')}",
           f"`{record['command']}`"]  # fmt: skip
    return "| " + " | ".join(str(c) for c in row) + " |\n"


def rebuild_tables(out: str | os.PathLike) -> list[Path]:
    """Rewrite every <bench>.md from the JSON records in the folder `out`, oldest first."""
    out_dir = Path(out)
    by_bench: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(out_dir.glob("*.json")):
        record = json.loads(path.read_text())
        if "benchmark" in record and "table_columns" in record:
            by_bench.setdefault(record["benchmark"], []).append(record)
    written = []
    for bench, records in sorted(by_bench.items()):
        records.sort(key=lambda r: r["date"])
        columns = records[-1]["table_columns"]
        table = out_dir / f"{bench}.md"
        table.write_text(table_header(bench, columns) + "".join(table_row(r, columns) for r in records))
        written.append(table)
    return written


def summarize_times(step_times: Sequence[float], batch_size: int, world: int = 1) -> dict[str, float]:
    """ms/step (median and mean) and samples/s from per-step wall times in seconds."""
    import statistics

    if not step_times:
        return {"ms_per_step": float("nan"), "ms_per_step_mean": float("nan"), "samples_per_second": float("nan")}
    med = statistics.median(step_times)
    mean = sum(step_times) / len(step_times)
    return {
        "ms_per_step": med * 1e3,
        "ms_per_step_mean": mean * 1e3,
        "samples_per_second": batch_size * world / mean,
    }


if __name__ == "__main__":
    # python -m benchmarks.benchlib rebuild RESULTS_DIR: regenerate the markdown tables.
    if len(sys.argv) == 3 and sys.argv[1] == "rebuild":
        for table in rebuild_tables(sys.argv[2]):
            print(f"wrote {table}")
    else:
        print("usage: python -m benchmarks.benchlib rebuild RESULTS_DIR", file=sys.stderr)
        sys.exit(2)
