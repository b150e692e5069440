"""Faults a scheduler causes: preemption signals, a dead worker that the launcher restarts, a
restart on fewer processes, and --resume-from auto, which makes one command serve all starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import accelerate
import pytest
import torch
from packaging.version import Version

from accel_mnist.run import checkpoint as ckpt
from accel_mnist.training.preemption import EXIT_PREEMPTED
from tests.helpers import (
    ARGS,
    CONFIGS,
    DDP,
    ENV,
    REPO,
    ZERO2,
    command,
    final_weights,
    find_rank,
    kill_tree,
    metrics_rows,
    preempt_and_resume,
    run,
    same_weights,
    start_and_wait_for,
)
from tests.shared_runs import OUT

ONE_PROCESS_LAUNCH = ["--config_file", str(CONFIGS / "cpu.yaml")]
SIGNAL_PASSED_ON = Version(accelerate.__version__) >= Version("1.16")


@pytest.mark.slow
@pytest.mark.parametrize("launch, sig", [(None, signal.SIGTERM), (DDP, signal.SIGTERM), (None, signal.SIGUSR1),
                                         (ONE_PROCESS_LAUNCH, signal.SIGTERM)],
                         ids=["single", "ddp", "single-sigusr1", "one-process-launch"])  # fmt: skip
def test_a_signal_saves_the_current_step_and_auto_resumes_exactly(launch, sig, tmp_path, mnist_dir, shared_run):
    if launch is ONE_PROCESS_LAUNCH and not SIGNAL_PASSED_ON:
        pytest.skip("accelerate < 1.16's one-process launcher does not pass SIGTERM on")
    preempt_and_resume(launch, tmp_path, sig, whole=uninterrupted(shared_run, launch))


def uninterrupted(shared_run, launch: list[str] | None) -> Path:
    """The fault tests' run under `launch`, whole: made once a session (tests/shared_runs.py), as the
    signal and the dead-worker tests under one launch both compare with it."""
    whole = shared_run(command(launch, OUT))
    assert whole.returncode == 0, whole.stderr[-3000:]
    return whole.out


@pytest.mark.slow
@pytest.mark.parametrize("launch", [DDP, ZERO2], ids=["ddp", "zero2"])
def test_a_dead_worker_is_restarted_by_the_launcher_and_resumes(launch, tmp_path, mnist_dir, shared_run):
    whole, broken = uninterrupted(shared_run, launch), tmp_path / "broken"
    restarting = ["--max_restarts", "1", *launch]
    proc, log = start_and_wait_for(command(restarting, broken, "--resume-from", "auto"), broken, 20)
    try:
        os.kill(find_rank(proc.pid, 1), signal.SIGKILL)
        code = proc.wait(timeout=300)
    finally:
        kill_tree(proc.pid)
    err = log.read_text()
    assert code == 0, err[-4000:]
    assert "connectFullMesh" not in err
    results = json.loads((broken / "results.json").read_text())
    assert results["steps"] == 120 and results["num_processes"] == 2
    assert metrics_rows(broken) == metrics_rows(whole)
    same_weights(whole, broken)


@pytest.mark.slow
def test_resume_on_fewer_processes_keeps_the_samples_of_each_step(tmp_path, mnist_dir):
    """2 processes x 32 for 20 steps, then 1 x 64: the same 64 samples per step as 1 x 64 all along."""
    two, one = tmp_path / "two_then_one", tmp_path / "one"
    common = ["--max-steps", "40", "--checkpoint-every", "20", "--eval-every", "20"]
    proc = run(command(DDP, two, *common, "--batch-size", "32", "--max-steps", "20"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    at_20 = final_weights(two)
    proc = run(command(None, two, *common, "--batch-size", "32", "--resume-from", "auto"))
    assert proc.returncode == 2 and "pass --batch-size 64 to keep it" in proc.stderr, proc.stderr[-2000:]
    proc = run(command(None, two, *common, "--batch-size", "64", "--resume-from", "auto"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    proc = run(command(None, one, *common, "--batch-size", "64"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed, reference = final_weights(two), final_weights(one)
    # DDP averages two means of 32 where one process takes the mean of 64: equal up to rounding.
    for k in reference:
        assert torch.allclose(resumed[k], reference[k], rtol=0, atol=1e-5), k
        assert (resumed[k] - at_20[k]).abs().max() > 1e-3  # the last 20 steps did move the weights
    rows, ref = metrics_rows(two), metrics_rows(one)
    assert [r["step"] for r in rows] == [r["step"] for r in ref] == [20, 40]
    for row, ref_row in zip(rows, ref, strict=True):
        assert row["train_loss"] == pytest.approx(ref_row["train_loss"], rel=1e-4)
        assert row["test_loss"] == pytest.approx(ref_row["test_loss"], rel=1e-4)


def _children(pid: int) -> list[int]:
    found = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(p))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_the_slurm_requeue_script_requeues_a_preempted_run_and_then_finishes_it(tmp_path, mnist_dir):
    """examples/slurm_requeue.sbatch with stand-ins for srun (one task) and scontrol (a log)."""
    bin_dir, out = tmp_path / "bin", tmp_path / "run"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/bash\necho "$*" >> {tmp_path / "scontrol.log"}\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    env = {**ENV, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7", "OUT": str(out),
           "CONFIG": str(CONFIGS / "multi_cpu.yaml"), "ACCELERATE": str(Path(sys.executable).with_name("accelerate")),
           "TRAIN_ARGS": " ".join(ARGS)}  # fmt: skip
    script = ["bash", str(REPO / "examples" / "slurm_requeue.sbatch")]
    log = tmp_path / "job.out"
    with open(log, "w") as f:
        job = subprocess.Popen(script, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        marker = ckpt.checkpoint_dir(out) / "step_20" / ckpt.STATE_FILE
        deadline = time.monotonic() + 300
        while not marker.exists():
            assert job.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.02)
        # Slurm signals the batch shell and the job step's tasks (the launcher).
        for pid in [job.pid, *_children(job.pid)]:
            os.kill(pid, signal.SIGTERM)
        assert job.wait(timeout=120) == EXIT_PREEMPTED, log.read_text()[-3000:]
    finally:
        kill_tree(job.pid)
    assert (tmp_path / "scontrol.log").read_text() == "requeue 7\n"
    assert "preempted: {" in log.read_text()
    # The requeued job runs the same script again: it resumes and finishes.
    proc = subprocess.run(script, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["steps"] == 120
    assert (tmp_path / "scontrol.log").read_text() == "requeue 7\n"
