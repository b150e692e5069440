"""A kill at any moment is harmless, and workers never outlive their launcher.

SIGKILL of the whole launch at moments chosen by the clock (not by the checkpoints: during
start-up, a step, an evaluation or a save), each followed by `--resume-from auto`, ends with the
uninterrupted run's weights and metrics rows, timings aside. SIGKILL of the `accelerate launch`
alone ends its workers within seconds, and the last complete checkpoint resumes exactly.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from accel_mnist.run import checkpoint as ckpt
from tests.helpers import DDP, ENV, REPO, command, kill_tree, metrics_rows, run, same_weights, start_and_wait_for
from tests.process_tree import alive, tree

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("launch/test_kill_anytime.py")

# mlp: dropout, so that each process's restored RNG state matters too.
LONG = ["--model", "mlp", "--max-steps", "1000", "--checkpoint-every", "50", "--eval-every", "250"]
KILLS = 3


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run of each launch (None: one process, or DDP), and its wall time."""
    done: dict[str, tuple[Path, float]] = {}

    def get(launch: list[str] | None) -> tuple[Path, float]:
        key = "ddp" if launch else "single"
        if key not in done:
            out = tmp_path_factory.mktemp("reference") / key
            start = time.monotonic()
            proc = run(command(launch, out, *LONG))
            assert proc.returncode == 0, proc.stderr[-3000:]
            done[key] = (out, time.monotonic() - start)
        return done[key]

    return get


@pytest.mark.usefixtures("mnist_dir")  # the real MNIST files: skipped where they are absent
@pytest.mark.slow
@pytest.mark.parametrize("launch", [None, DDP], ids=["single", "ddp"])
def test_sigkill_at_moments_chosen_by_the_clock_then_auto_resume_is_exact(launch, reference, tmp_path):
    whole, wall = reference(launch)
    out = tmp_path / "run"
    seed = int(time.time())
    rng = random.Random(seed)
    cmd = command(launch, out, *LONG, "--resume-from", "auto")
    events = []
    for kill in range(KILLS):
        before = ckpt.list_checkpoints(out)
        with open(tmp_path / "stderr", "w") as stderr:
            proc = subprocess.Popen(cmd, env=ENV, cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL,
                                    stderr=stderr)  # fmt: skip
        start = time.monotonic()
        if kill == 0:  # anywhere in the first three quarters of a run: start-up included
            deadline = start + rng.uniform(0.15, 0.75) * wall
        else:  # once this start trains (a checkpoint of its own), within the next two seconds
            while ckpt.list_checkpoints(out) == before and proc.poll() is None:
                time.sleep(0.02)
            deadline = time.monotonic() + rng.uniform(0.0, 2.0)
        try:
            code = proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            events.append(f"ended with {code} before the kill")
            break
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # the launcher and every worker at once, as a scheduler's kill
            proc.wait()
        latest = ckpt.list_checkpoints(out)
        events.append(f"killed at {time.monotonic() - start:.1f} s, latest {latest[-1].name if latest else 'none'}")
        if (out / "results.json").exists():
            break  # killed while it was shutting down: the next start returns the finished run
    print(f"seed {seed}, reference {wall:.1f} s: {'; '.join(events)}")  # shown with pytest -s
    proc = run(cmd)
    assert proc.returncode == 0, f"seed {seed}, {events}: {proc.stderr[-3000:]}"
    assert metrics_rows(out) == metrics_rows(whole), f"seed {seed}, {events}"
    same_weights(whole, out)


@pytest.mark.usefixtures("mnist_dir")  # the real MNIST files: skipped where they are absent
@pytest.mark.slow
def test_workers_exit_soon_after_their_launcher_is_killed(reference, tmp_path):
    whole, _ = reference(DDP)
    out = tmp_path / "run"
    proc, log = start_and_wait_for(command(DDP, out, *LONG, "--resume-from", "auto"), out, 50)
    workers = [p for p in tree(proc.pid) if p != proc.pid]
    try:
        assert len(workers) == 2, workers  # accelerate launch runs torchrun's agent itself
        os.kill(proc.pid, signal.SIGKILL)  # the launcher alone, as when its terminal or shell is killed
        killed = time.monotonic()
        proc.wait()
        while any(alive(w) for w in workers) and time.monotonic() - killed < 30:
            time.sleep(0.1)
        gone_after = time.monotonic() - killed
    finally:
        kill_tree(proc.pid)
        for w in workers:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
    print(f"workers {workers} gone {gone_after:.1f} s after their launcher was killed")  # shown with pytest -s
    assert gone_after < 10, f"workers still alive {gone_after:.0f} s after their launcher was killed"
    err = log.read_text()
    assert err.count(f"error: the launcher (pid {proc.pid}) is gone, so this run stops") == 1, err[-3000:]
    assert not (out / "results.json").exists()
    proc = run(command(DDP, out, *LONG, "--resume-from", "auto"))  # not blocked by the dead run's lock
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert metrics_rows(out) == metrics_rows(whole)
    same_weights(whole, out)
