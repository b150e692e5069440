"""Two "machines" on localhost: one `accelerate launch --num_machines 2 --machine_rank R` each.

Each machine runs one process (--num_processes is the total, 2), so the world is the same as a
single-machine 2-process run, and the metrics must be the same too. This is what
examples/slurm_multinode.sbatch does on a real cluster, one launch per node.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import (
    CONFIGS,
    MNIST_DIR,
    MULTINODE,
    REPO,
    accelerate_launch,
    free_port,
    machine_args,
    real_mnist_present,
)

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("launch/test_multinode.py")

TRAIN_ARGS = ["--model", "linear", "--batch-size", "32", "--max-steps", "20", "--eval-every", "10",
              "--eval-batch-size", "2500", "--no-download"]  # fmt: skip
# The reference: one machine, 2 processes, DDP. ZeRO-2 is compared with it too: with two ranks
# its reduce-scatter averages the same two fp32 gradients as DDP's all-reduce ((a + b) / 2 and
# a / 2 + b / 2 are the same float), so the runs agree to the last digit (seen: identical rows),
# and a second single-machine launch (~30 s here) would only repeat test_distributed.py.
SINGLE_MACHINE = ["--config_file", str(CONFIGS / "multi_cpu.yaml")]


def launch_two_machines(launch_args, out_dirs, *extra, data_dirs=(MNIST_DIR, MNIST_DIR), timeout=300):
    """Start machine 0 and machine 1 together, machine R writing to out_dirs[R] (the same path
    twice stands for shared storage)."""
    accelerate = Path(sys.executable).with_name("accelerate")
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1"}
    port = free_port()
    procs = []
    for rank, (out, data) in enumerate(zip(out_dirs, data_dirs, strict=True)):
        cmd = [str(accelerate), "launch", *launch_args, *machine_args(rank, port), "-m", "accel_mnist", "train",
               *TRAIN_ARGS, "--output-dir", str(out), "--data-dir", str(data), "--quiet", *extra]  # fmt: skip
        procs.append(
            subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO)
        )
    deadline = time.monotonic() + timeout
    results = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=max(deadline - time.monotonic(), 1))
            results.append((proc.returncode, err))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    run_dir = tmp_path_factory.mktemp("one_machine")
    proc, results = accelerate_launch(SINGLE_MACHINE, TRAIN_ARGS, run_dir, timeout=300)
    assert proc.returncode == 0, f"one-machine DDP failed:\n{proc.stderr[-4000:]}"
    assert (results["distributed_type"], results["num_processes"]) == ("MULTI_CPU", 2)
    return read_rows(run_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name, distributed_type, zero_stage", [("ddp", "MULTI_CPU", 0), ("zero2", "DEEPSPEED", 2)])
def test_two_machines_match_one_machine(reference, tmp_path, name, distributed_type, zero_stage):
    shared = tmp_path / "shared"
    for rank, (code, err) in enumerate(launch_two_machines(MULTINODE[name], [shared, shared])):
        assert code == 0, f"machine {rank} failed:\n{err[-4000:]}"
    results = json.loads((shared / "results.json").read_text())
    assert (results["distributed_type"], results["num_processes"], results["zero_stage"]) == (
        distributed_type, 2, zero_stage)  # fmt: skip
    assert results["mixed_precision"] == "no" and results["steps"] == 20
    assert not list(shared.glob(".accel_mnist_probe_*"))  # the shared-storage probe is cleaned up
    rows, ref = read_rows(shared), reference
    assert [r["step"] for r in rows] == [r["step"] for r in ref] == [10, 20]
    for row, ref_row in zip(rows, ref, strict=True):
        assert row["test_samples"] == ref_row["test_samples"] == 10000
        assert row["test_accuracy"] == ref_row["test_accuracy"]
        for key in ("train_loss", "test_loss", "lr"):
            assert row[key] == pytest.approx(ref_row[key], rel=1e-6), key


def one_error_line(code: int, err: str) -> str:
    """The `error:` line of a machine whose one worker stopped with exit code 2 (torchrun: 1)."""
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert code == 1 and len(lines) == 1 and "exitcode  : 2" in err, err[-4000:]
    return lines[0]


@pytest.mark.slow
def test_machines_without_shared_storage_stop_together_with_one_error(tmp_path, mnist_dir):
    machine0, machine1 = tmp_path / "machine0", tmp_path / "machine1"
    results = launch_two_machines(MULTINODE["ddp"], [machine0, machine1])
    lines = {one_error_line(code, err) for code, err in results}
    assert len(lines) == 1 and "is not shared by every node" in lines.pop()
    assert not (machine0 / "checkpoints").exists() and not (machine0 / "config.json").exists()
    # A resume decided on each node alone would stop only the node without checkpoints (the
    # other entering a collective); agreed, both stop with the first rank's error.
    (machine0 / "checkpoints" / "step_10").mkdir(parents=True)
    (machine0 / "checkpoints" / "step_10" / "trainer_state.json").write_text("{}")
    results = launch_two_machines(MULTINODE["ddp"], [machine0, machine1], "--resume-from", "latest")
    lines = {one_error_line(code, err) for code, err in results}
    assert len(lines) == 1 and f"no complete checkpoint in {machine1 / 'checkpoints'}" in lines.pop()


@pytest.mark.slow
def test_node_local_data_directories_are_read_by_each_node(tmp_path, mnist_dir):
    shared, data = tmp_path / "shared", [tmp_path / "data0", tmp_path / "data1"]
    for d in data:  # a copy per "node" (links to the same files)
        d.mkdir()
        for f in mnist_dir.iterdir():
            (d / f.name).symlink_to(f)
    results = launch_two_machines(MULTINODE["ddp"], [shared, shared], "--max-steps", "5", data_dirs=data)
    for rank, (code, err) in enumerate(results):
        assert code == 0, f"machine {rank} failed:\n{err[-4000:]}"
        assert f"data directory {data[rank]} is not shared by every node" in err, err[-3000:]
    assert not [p for d in data for p in d.glob(".accel_mnist_probe_*")]
    assert json.loads((shared / "results.json").read_text())["steps"] == 5
