"""The files a run writes besides checkpoints: config.json, metrics.jsonl, results.json.

Plain file operations; which process calls them, and when, is decided by run_dir.RunDir.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import UsageError
from ..files import write_atomic, writing

CONFIG_FILE = "config.json"
METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "results.json"
# Written by the main process when a signal stopped the run after its checkpoint.
PREEMPTED_FILE = "preempted.json"
# A row is a few hundred bytes; a longer line is not one of ours, and reading stops there.
MAX_METRICS_LINE = 1 << 16


def metrics_lines(path: Path) -> Iterator[tuple[int, str]]:
    """metrics.jsonl's (line number, line), a line at a time, so that memory stays bounded
    whatever the file holds; UsageError at a line longer than MAX_METRICS_LINE characters."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(iter(partial(f.readline, MAX_METRICS_LINE + 1), ""), 1):
            if len(line) > MAX_METRICS_LINE:
                raise UsageError(f"{path}:{number}: a line longer than {MAX_METRICS_LINE} characters")
            yield number, line.rstrip("\n")


def truncate_metrics(run_dir: Path, resume_step: int | None) -> None:
    """Keep metrics.jsonl's rows up to `resume_step` (none for a fresh run).

    Rows logged after the checkpoint by the run that died are logged again on resume. Written
    atomically: a disk that fills up meanwhile leaves the old rows as they were.
    """
    path = run_dir / METRICS_FILE

    def kept() -> Iterator[bytes]:
        if resume_step is None or not path.exists():
            return
        try:
            for _, line in metrics_lines(path):
                if json.loads(line)["step"] <= resume_step:
                    yield (line + "\n").encode()
        except (UsageError, ValueError, KeyError, TypeError):
            return  # a line cut short by the crash (or not ours), and nothing valid after it

    write_atomic(path, kept())


def append_metrics(run_dir: Path, row: dict[str, Any]) -> None:
    """Append one evaluation's metrics as a JSON line (a line cut short by a full disk is
    dropped on resume, as one cut short by a crash)."""
    path = run_dir / METRICS_FILE
    with writing(METRICS_FILE, path), open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
