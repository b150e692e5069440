"""One writer per output directory, on a real small file system (a tmpfs the test mounts): a
second run into a live directory stops with one error line naming the holder, exit 2, and
touches nothing; the live run goes on undisturbed."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import pytest

from tests.helpers import DDP, command, kill_tree, run, start_and_wait_for
from tests.process_tree import signal_tree
from tests.small_fs import small_fs

LONG = ["--epochs", "4", "--max-steps", "3000", "--checkpoint-every", "100", "--eval-every", "500"]


@pytest.fixture
def fs(tmp_path):
    with small_fs(tmp_path / "mnt") as mounts:
        yield mounts


def snapshot(directory: Path) -> dict[str, tuple[int, int, int]]:
    """Every file and folder below `directory`: inode, size, modification time."""
    return {str(p.relative_to(directory)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(directory.rglob("*"))}  # fmt: skip


@pytest.mark.parametrize("second", [None, pytest.param(DDP, marks=pytest.mark.slow)], ids=["single", "ddp"])
def test_a_second_run_into_a_live_directory_stops_and_touches_nothing(second, fs, mnist_dir):
    out = fs.mount(size="16m") / "run"
    first, log = start_and_wait_for(command(None, out, *LONG, "--resume-from", "auto"), out, 100)
    try:
        # Stopped, the first run holds its lock and writes nothing while the second one tries.
        signal_tree(first.pid, signal.SIGSTOP)
        before = snapshot(out)
        tries = [["--resume-from", "auto"], ["--overwrite"]] if second is None else [["--resume-from", "auto"]]
        for extra in tries:
            proc = run(command(second, out, *LONG, *extra), timeout=300)
            errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
            # One line for the launch, also from two processes (printed by the local main process).
            assert len(errors) == 1, proc.stderr[-3000:]
            assert f"{out} is in use by another run (pid {first.pid} on host {socket.gethostname()}, " in errors[0]
            # One process exits 2; torchrun reports its workers' failure with 1.
            assert proc.returncode == (2 if second is None else 1), proc.stderr[-3000:]
            if second is not None:
                assert "exitcode  : 2" in proc.stderr, proc.stderr[-3000:]
        assert snapshot(out) == before
        signal_tree(first.pid, signal.SIGCONT)
        assert first.wait(timeout=300) == 0, log.read_text()[-3000:]
    finally:
        kill_tree(first.pid)
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == [500, 938, 1000, 1500, 1876, 2000, 2500, 2814, 3000]  # one row per evaluation, none twice
    assert json.loads((out / "results.json").read_text())["steps"] == 3000
