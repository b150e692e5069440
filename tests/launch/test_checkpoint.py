"""Checkpoints and resume under faults that kill processes: SIGKILL of a run (one process, DDP,
ZeRO-2/3) or inside a save, a dead rank, and the faults of one process on two."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from accel_mnist import TrainConfig, train
from accel_mnist.run import checkpoint as ckpt
from tests.helpers import (
    CONFIGS,
    MNIST_DIR,
    REPO,
    final_weights,
    find_rank,
    kill_tree,
    launch_prefix,
    metrics_rows,
    run_command,
)

# mlp has dropout, so an exact resume also needs the RNG state back; eval and checkpoint
# steps do not line up, so the per-rank loss sums since the last eval must come back too.
RUN_ARGS = ["--model", "mlp", "--max-steps", "120", "--eval-every", "30", "--checkpoint-every", "40",
            "--keep-checkpoints", "2", "--no-download", "--quiet", "--no-export"]  # fmt: skip


def launch_cmd(launch_args: list[str] | None, out: Path, *extra: str) -> list[str]:
    train_args = ["train", *RUN_ARGS, "--output-dir", str(out), *extra]
    if launch_args is None:
        return [sys.executable, "-m", "accel_mnist", *train_args]
    return [*launch_prefix(launch_args), "-m", "accel_mnist", *train_args]


def run_until_checkpoint_then_kill(cmd, out: Path, step: int, timeout=600) -> None:
    """Start the run, SIGKILL its whole process group once checkpoint `step` is complete."""
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1"}
    log = out.with_name(out.name + ".stderr")  # a file: an unread pipe would fill and block the run
    with open(log, "w") as stderr:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True,
                                stdout=subprocess.DEVNULL, stderr=stderr)  # fmt: skip
    deadline = time.monotonic() + timeout
    marker = ckpt.checkpoint_dir(out) / f"step_{step}" / ckpt.STATE_FILE
    while not marker.exists():
        assert proc.poll() is None, f"run ended before checkpoint {step}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.02)
    kill_tree(proc.pid)
    proc.wait()
    time.sleep(1)  # nothing may still be writing
    assert not (out / "results.json").exists(), "the run finished before it was killed"


STRATEGIES = {
    "single": None,
    "ddp": ["--config_file", str(CONFIGS / "multi_cpu.yaml")],
    "zero2": ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"],
    "zero3": ["--config_file", str(CONFIGS / "zero3.yaml"), "--mixed_precision", "no"],
}


@pytest.mark.parametrize(
    "strategy", ["single", pytest.param("ddp", marks=pytest.mark.slow),
                 pytest.param("zero2", marks=pytest.mark.slow), pytest.param("zero3", marks=pytest.mark.slow)],
)  # fmt: skip
def test_sigkill_then_resume_equals_uninterrupted(strategy, tmp_path, mnist_dir):
    launch = STRATEGIES[strategy]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    proc = run_command(launch_cmd(launch, whole))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Killed at the first checkpoint, so that 80 steps remain to be lost if resume were wrong.
    run_until_checkpoint_then_kill(launch_cmd(launch, broken), broken, 40)
    proc = run_command(launch_cmd(launch, broken, "--resume-from", "latest"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert metrics_rows(broken) == metrics_rows(whole)
    assert [p.name for p in ckpt.list_checkpoints(broken)] == ["step_80", "step_120"]  # keep 2
    a, b = final_weights(whole), final_weights(broken)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    results = json.loads((broken / "results.json").read_text())
    assert results["steps"] == 120 and results["num_processes"] == (1 if launch is None else 2)


@pytest.fixture
def config(mnist_dir, tmp_path):
    return TrainConfig(model="linear", data_dir=str(mnist_dir), download=False, quiet=True, export=False,
                       output_dir=str(tmp_path / "run"), max_steps=60, checkpoint_every=20, eval_every=20)  # fmt: skip


def test_sigkill_inside_a_save(config, tmp_path):
    script = f"""
import json, os, signal
from accelerate import Accelerator
from accel_mnist import TrainConfig, train
real = Accelerator.save_state
calls = []
def dying_save(self, output_dir=None, **kw):
    calls.append(1)
    if len(calls) == 2:
        real(self, output_dir, **kw)
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, output_dir, **kw)
Accelerator.save_state = dying_save
train(TrainConfig.from_dict(json.loads({json.dumps(config.to_dict())!r})))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert [p.name for p in ckpt.list_checkpoints(config.output_dir)] == ["step_20"]
    assert train(config.replace(resume_from="latest"))["steps"] == 60


@pytest.mark.slow
def test_a_dead_process_stops_the_others(tmp_path, mnist_dir):
    """SIGKILL one rank of a 2-process run: the launcher must end, not hang."""
    out = tmp_path / "run"
    cmd = launch_cmd(STRATEGIES["ddp"], out, "--max-steps", "100000", "--checkpoint-every", "20")
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(cmd, env=env, cwd=REPO, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        marker = ckpt.checkpoint_dir(out) / "step_20" / ckpt.STATE_FILE
        deadline = time.monotonic() + 300
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the run never checkpointed"
        rank1 = find_rank(proc.pid, 1)
        os.kill(rank1, signal.SIGKILL)
        killed_at = time.monotonic()
        proc.wait(timeout=120)
        assert proc.returncode != 0
        assert time.monotonic() - killed_at < 120
    finally:
        kill_tree(proc.pid)


# The same faults with two processes: a script run by `accelerate launch` patches the save
# or passes a model that turns NaN, since neither can be asked for on the command line.
FAULT_SCRIPT = """
import json, os, signal, sys
from accelerate import Accelerator
from torch import nn
from accel_mnist import TrainConfig, train

config = TrainConfig.from_dict(json.loads(sys.argv[2]))
if sys.argv[1] == "die_in_second_save":
    real, calls = Accelerator.save_state, []
    def dying_save(self, output_dir=None, **kw):
        calls.append(1)
        result = real(self, output_dir, **kw)
        if len(calls) == 2 and self.is_main_process:
            os.kill(os.getpid(), signal.SIGKILL)  # rank 0 dies with its shard written
        return result
    Accelerator.save_state = dying_save
    train(config)
elif sys.argv[1] == "plain":
    train(config)
else:
    class NaNAfter(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.calls = nn.Linear(784, 10), 0
        def forward(self, x):
            self.calls += self.training
            out = self.fc(x.flatten(1))
            return out * float("nan") if self.training and self.calls >= 25 else out
    train(config, model=NaNAfter())
"""


def launch_script(launch: list[str], tmp_path: Path, mode: str, config: TrainConfig):
    script = tmp_path / "fault.py"
    script.write_text(FAULT_SCRIPT)
    cmd = [*launch_prefix(launch), str(script), mode, json.dumps(config.to_dict())]
    return run_command(cmd)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "zero2", "zero3"])
def test_two_process_death_inside_a_save_keeps_the_previous_checkpoint(strategy, config, tmp_path):
    proc = launch_script(STRATEGIES[strategy], tmp_path, "die_in_second_save", config)
    assert proc.returncode != 0
    assert [p.name for p in ckpt.list_checkpoints(config.output_dir)] == ["step_20"]
    proc = launch_script(STRATEGIES[strategy], tmp_path, "plain", config.replace(resume_from="latest"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((Path(config.output_dir) / "results.json").read_text())["steps"] == 60


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "zero2"])
def test_two_process_persistent_nan_stops_every_rank(strategy, config, tmp_path):
    bad = config.replace(max_nonfinite=3, log_every=1, eval_every=0)
    proc = launch_script(STRATEGIES[strategy], tmp_path, "nan", bad)
    assert proc.returncode != 0
    assert "not finite for 3 optimizer steps" in proc.stderr
    last = ckpt.list_checkpoints(config.output_dir)[-1]
    assert last.name == "step_20"
