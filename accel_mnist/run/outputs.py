"""The files a run writes besides checkpoints: config.json, metrics.jsonl, results.json.

Plain file operations; which process calls them, and when, is decided by run_dir.RunDir.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..files import write_atomic, writing

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "results.json"
# Written by the main process when a signal stopped the run after its checkpoint.
PREEMPTED_FILE = "preempted.json"


def truncate_metrics(run_dir: Path, resume_step: int | None) -> None:
    """Keep metrics.jsonl's rows up to `resume_step` (none for a fresh run).

    Rows logged after the checkpoint by the run that died are logged again on resume. Written
    atomically: a disk that fills up meanwhile leaves the old rows as they were.
    """
    path = run_dir / METRICS_FILE
    keep = []
    if resume_step is not None and path.exists():
        for line in path.read_text().splitlines():
            try:
                if json.loads(line)["step"] <= resume_step:
                    keep.append(line + "\n")
            except (ValueError, KeyError, TypeError):
                break  # a line cut short by the crash, and nothing valid after it
    write_atomic(path, "".join(keep).encode())


def append_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one evaluation's metrics as a JSON line (a line cut short by a full disk is
    dropped on resume, as one cut short by a crash)."""
    path = run_dir / METRICS_FILE
    with writing(METRICS_FILE, path), open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
