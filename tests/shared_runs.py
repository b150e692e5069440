"""Runs that several tests only read, made once per pytest session, across pytest-xdist's workers.

Several launch tests start with the same uninterrupted run (the reference a killed and resumed
run must equal, or the `accelerate launch` run another launcher must match). Each such command
is run once: the first test to ask runs it under a file lock, the others (on any worker) wait
for the lock and read what it left. A command is the same when its argv is, the output folder
and an OS-picked port aside; its environment is run_command's (the real MNIST files, one thread).

The folder is the readers' to read: a test that needs to change a run copies it first.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

OUT = "{out}"  # where the run's output folder goes in the argv a caller gives
# Flags whose value is a port: a launch on a port of its own is the same run.
PORT_FLAGS = ("--main_process_port", "--master_port")


@dataclass(frozen=True)
class SharedRun:
    """A finished run: its output folder (read only), exit code and output."""

    out: Path
    returncode: int
    stdout: str
    stderr: str

    @property
    def results(self) -> dict | None:
        """results.json, or None when the run wrote none."""
        path = self.out / "results.json"
        return json.loads(path.read_text()) if path.exists() else None


def run_key(argv: list[str]) -> str:
    """The name a command's run is kept under: a hash of its argv without port values."""
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        skip = arg in PORT_FLAGS
        kept.append(arg)
    return hashlib.sha256(json.dumps(kept).encode()).hexdigest()[:16]


def shared_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's folder of shared runs: under pytest-xdist, the parent of every worker's base
    temporary folder (one per session); without it, the base temporary folder itself."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "shared-runs"
    root.mkdir(parents=True, exist_ok=True)
    return root


def made_once(root: Path, argv: list[str], run: Callable[[list[str]], object]) -> SharedRun:
    """Run `argv` (OUT standing for its output folder) with `run` unless this session already has; its
    SharedRun either way. `run` returns a CompletedProcess (stdout and stderr as text)."""
    from filelock import FileLock  # torch's own dependency

    key = run_key(argv)
    out, record = root / key, root / f"{key}.json"
    with FileLock(str(root / f"{key}.lock")):
        if not record.exists():
            proc = run([arg.replace(OUT, str(out)) for arg in argv])
            done = {"argv": argv, "returncode": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}
            record.write_text(json.dumps(done))
        done = json.loads(record.read_text())
    return SharedRun(out, done["returncode"], done["stdout"], done["stderr"])
