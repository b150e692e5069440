"""Shared pieces of the benchmark scripts: hardware/version facts and each command's record.

Results folders have one format: `suite.json`, written by `python -m benchmarks SUITE`
(runner.py). A module run with `--out DIR` also saves its whole record as
`DIR/<bench>-<UTC stamp>-<tag>.json`; under the runner DIR is the run's own folder, and the
runner folds those records into suite.json (`runs[i].records`) before the folder goes.
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
    from accel_mnist.training.records import versions as _versions

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


def save_record(bench: str, tag: str, record: dict[str, Any], out: str | os.PathLike | None) -> Path | None:
    """Fill in the record's hardware, versions, date and command; write it to `out` (if given) as JSON."""
    record.setdefault("benchmark", bench)
    hw = record.setdefault("hardware", hardware())
    record.setdefault("versions", versions())
    record.setdefault("date", utc_now())
    record.setdefault("command", command_line())
    record.setdefault("hardware_label", hardware_label(hw))
    if out is None:
        return None
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = record["date"].replace(":", "").replace("-", "")
    path = out_dir / f"{bench}-{stamp}-{_slug(tag)}.json"
    n = 1
    while path.exists():
        n += 1
        path = out_dir / f"{bench}-{stamp}-{_slug(tag)}-{n}.json"
    path.write_text(json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")
    print(f"[{bench}] wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}", file=sys.stderr)
    return path
