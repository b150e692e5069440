"""A disk that fills up, and one that cannot be written, on a real small file system (a tmpfs the
test mounts): one error line saying what, where and how much is free, exit code 74, the partial
checkpoint removed and the previous one resumable, bit for bit."""

from __future__ import annotations

import json
import signal
import time

import pytest

from accel_mnist.errors import EXIT_STORAGE
from accel_mnist.run import checkpoint as ckpt
from tests.helpers import DDP, command, kill_tree, metrics_rows, run, same_weights, start_and_wait_for
from tests.process_tree import signal_tree
from tests.small_fs import fill, small_fs

# Checkpoints at 150 and 300 and the last step; one evaluation, at the end, so that the first
# write after the disk fills is the checkpoint of step 300.
ARGS = ["--max-steps", "400", "--checkpoint-every", "150", "--eval-every", "400"]


@pytest.fixture
def fs(tmp_path):
    with small_fs(tmp_path / "mnt") as mounts:
        yield mounts


@pytest.mark.parametrize("launch", [None, pytest.param(DDP, marks=pytest.mark.slow)], ids=["single", "ddp"])
def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one_resumable(launch, fs, tmp_path, mnist_dir):
    whole = tmp_path / "whole"
    proc = run(command(launch, whole, *ARGS))
    assert proc.returncode == 0, proc.stderr[-3000:]
    disk = fs.mount(size="8m")
    out = disk / "run"
    proc, log = start_and_wait_for(command(launch, out, *ARGS, "--resume-from", "auto"), out, 150)
    try:
        signal_tree(proc.pid, signal.SIGSTOP)  # fill the disk between two checkpoints
        filler = fill(disk)
        signal_tree(proc.pid, signal.SIGCONT)
        code = proc.wait(timeout=300)
    finally:
        kill_tree(proc.pid)
    err = log.read_text()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]  # one line, from two processes too
    assert errors[0].startswith(f"error: cannot write checkpoint step_300 ({out / 'checkpoints' / '.tmp_step_300'}): "
                                "No space left on device, "), errors[0]  # fmt: skip
    assert "B free on that file system; the partial checkpoint was removed; step_150 is kept" in errors[0]
    assert launch is not None or "Traceback" not in err, err[-3000:]  # torchrun's own is its business
    # The workers exit 74; torchrun reports a failed worker with 1.
    assert code == (EXIT_STORAGE if launch is None else 1), err[-3000:]
    assert not list(ckpt.checkpoint_dir(out).glob(".tmp_*"))
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_150"]
    filler.unlink()  # space again: the same command continues from step 150
    proc = run(command(launch, out, *ARGS, "--resume-from", "auto"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"resumed from {out / 'checkpoints' / 'step_150'} at step 150" in proc.stdout
    assert metrics_rows(out) == metrics_rows(whole)
    same_weights(whole, out)
    assert json.loads((out / "results.json").read_text())["steps"] == 400


def test_an_output_directory_that_cannot_be_written_stops_before_training(fs, mnist_dir):
    disk = fs.mount(size="1m")
    fs.read_only(disk)
    start = time.monotonic()
    proc = run(command(None, disk / "run", *ARGS), timeout=300)
    assert proc.returncode == EXIT_STORAGE, proc.stderr[-3000:]
    last = proc.stderr.splitlines()[-1]
    assert last.startswith(f"error: cannot write the output directory ({disk / 'run'}): Read-only file system, ")
    assert last.endswith(" MB free on that file system"), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - start < 60  # stopped at the start, not after 400 steps
    fs.read_only(disk, False)
    assert list(disk.iterdir()) == []
