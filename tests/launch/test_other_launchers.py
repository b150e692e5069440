"""The same loop under DeepSpeed's launcher, torchrun and `python -m` as under `accelerate launch`.

Real launches on the CPU: `deepspeed --num_gpus 1 --module accel_mnist train --deepspeed_config`
(ZeRO-2, fp32) and `torchrun --nproc_per_node 2 -m accel_mnist train` (DDP, and ZeRO-2 with the
JSON) against `accelerate launch` with the same settings, to the parity tolerance of
tests/test_distributed.py; a checkpoint of the DeepSpeed launcher resumed by `python -m`; the
first line of each run; and the refusals that need a real launcher.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from accel_mnist.launch.launchers import free_port
from tests.helpers import (
    CONFIGS,
    MNIST_DIR,
    PARITY_TRAIN_ARGS,
    REPO,
    TIMING_KEYS,
    accelerate_launch,
    accelerate_launch_cmd,
    console_script,
    real_mnist_present,
)
from tests.shared_runs import OUT

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("launch/test_other_launchers.py")]

BIN = Path(sys.executable).parent
DS_JSON = str(CONFIGS / "deepspeed_config.json")  # ZeRO-2, every precision and size "auto": fp32 here
# As tests/test_distributed.py: accumulation, clipping and a schedule, which DeepSpeed keeps copies of.
TRAIN_ARGS = [*PARITY_TRAIN_ARGS, "--data-loader", "device"]
# The deepspeed launcher's run also checkpoints and exports: python -m resumes it below.
SAVING = [a for a in TRAIN_ARGS if a not in ("--no-export", "--no-save-checkpoints")] + ["--checkpoint-every", "15"]


def launch(prefix: list[str], train_args: list[str], out: Path) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`PREFIX accel_mnist train TRAIN_ARGS --output-dir OUT`, in an environment no launcher has touched."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_")}
    env.update(ACCEL_MNIST_DATA_DIR=str(MNIST_DIR), OMP_NUM_THREADS="1")
    cmd = [*prefix, "accel_mnist", "train", *train_args, "--output-dir", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    results = out / "results.json"
    return proc, json.loads(results.read_text()) if results.exists() else None


def deepspeed(*launcher_args: str) -> list[str]:
    return [console_script("deepspeed"), "--master_port", str(free_port()), *launcher_args, "--module"]


def torchrun(nproc: int) -> list[str]:
    return [str(BIN / "torchrun"), "--master_port", str(free_port()), "--nproc_per_node", str(nproc), "-m"]


def rows(out: Path) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING_KEYS} for line in lines]


def first_line(proc: subprocess.CompletedProcess) -> str:
    """accel_mnist's first line on stdout (DeepSpeed's own log lines and op builds aside)."""
    ours = [line for line in proc.stdout.splitlines() if line.startswith(("strategy: ", "epoch "))]
    assert ours, proc.stdout[-3000:]
    return ours[0]


ACCELERATE = {
    "zero2_1": ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no", "--num_processes", "1"],
    "ddp_2": ["--config_file", str(CONFIGS / "multi_cpu.yaml")],
    "zero2_2": ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"],
}
OTHERS = {  # name: (launcher prefix, training arguments, the accelerate run it must match)
    "deepspeed_1": (lambda: deepspeed("--num_gpus", "1"), [*SAVING, "--deepspeed_config", DS_JSON], "zero2_1"),
    "torchrun_ddp_2": (lambda: torchrun(2), TRAIN_ARGS, "ddp_2"),
    "torchrun_zero2_2": (lambda: torchrun(2), [*TRAIN_ARGS, "--deepspeed_config", DS_JSON], "zero2_2"),
}
EXPECTED = {
    "deepspeed_1": ("DEEPSPEED", 2, 1, "strategy: DeepSpeed ZeRO-2; precision: fp32; world size: 1; device: cpu"),
    "torchrun_ddp_2": ("MULTI_CPU", 0, 2, "strategy: DDP (MULTI_CPU); precision: fp32; world size: 2; device: cpu"),
    "torchrun_zero2_2": ("DEEPSPEED", 2, 2, "strategy: DeepSpeed ZeRO-2; precision: fp32; world size: 2; device: cpu"),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_run):
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    out = {}
    for name, launch_args in ACCELERATE.items():
        # The DDP and ZeRO-2 runs are test_distributed.py's: made once a session (tests/shared_runs.py).
        run = shared_run(accelerate_launch_cmd(launch_args, TRAIN_ARGS, OUT))
        assert run.returncode == 0, f"{name} failed:\n{run.stderr[-4000:]}"
        out[name] = (run, run.results, run.out)
    for name, (prefix, train_args, _) in OTHERS.items():
        run_dir = tmp_path_factory.mktemp(name)
        proc, results = launch(prefix(), train_args, run_dir)
        assert proc.returncode == 0, f"{name} failed:\n{proc.stderr[-4000:]}"
        out[name] = (proc, results, run_dir)
    return out


def assert_parity(got: list[dict], want: list[dict], name: str) -> None:
    gaps = {k: max(abs(g[k] - w[k]) / abs(w[k]) for g, w in zip(got, want, strict=True)) for k in ("train_loss",
            "test_loss")}  # fmt: skip
    print(f"parity {name}: " + ", ".join(f"{k} {v:.2e}" for k, v in gaps.items()))  # pytest -s shows them
    for g, w in zip(got, want, strict=True):
        assert g["step"] == w["step"] and g["test_samples"] == w["test_samples"] == 10000
        assert g["lr"] == pytest.approx(w["lr"], rel=1e-6)
        for key in ("train_loss", "test_loss"):
            assert g[key] == pytest.approx(w[key], rel=2e-4), (name, key)
        assert g["test_accuracy"] == pytest.approx(w["test_accuracy"], abs=1e-3), name


@pytest.mark.parametrize("name", list(OTHERS))
def test_matches_accelerate_launch(runs, name):
    proc, results, run_dir = runs[name]
    kind, stage, processes, line = EXPECTED[name]
    assert (results["distributed_type"], results["zero_stage"], results["num_processes"]) == (kind, stage, processes)
    assert results["mixed_precision"] == "no" and results["steps"] == 30
    assert results["global_batch_size"] == 32 * 2 * processes
    assert first_line(proc) == line
    reference = OTHERS[name][2]
    _, ref_results, ref_dir = runs[reference]
    assert ref_results["distributed_type"] == kind and ref_results["num_processes"] == processes
    assert_parity(rows(run_dir), rows(ref_dir), f"{name} vs accelerate launch {reference}")


def test_python_m_resumes_the_deepspeed_launchers_checkpoint_exactly(runs, tmp_path):
    """One process under DeepSpeed without any launcher: it continues the step-15 checkpoint of
    the `deepspeed --num_gpus 1` run to the same metrics and the same exported weights."""
    _, _, whole = runs["deepspeed_1"]
    resumed = tmp_path / "resumed"
    shutil.copytree(whole, resumed)
    # What a run stopped right after its step-15 checkpoint leaves behind.
    shutil.rmtree(resumed / "checkpoints" / "step_30")
    for name in ("results.json", "model.safetensors", "model_config.json"):
        (resumed / name).unlink()
    args = [*SAVING, "--deepspeed_config", DS_JSON, "--resume-from", "latest"]
    proc, results = launch([sys.executable, "-m"], args, resumed)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert first_line(proc) == EXPECTED["deepspeed_1"][3]
    assert f"resumed from {resumed / 'checkpoints' / 'step_15'} at step 15" in proc.stdout
    assert (results["distributed_type"], results["num_processes"], results["steps"]) == ("DEEPSPEED", 1, 30)
    assert rows(resumed) == rows(whole)
    a, b = load_file(whole / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


QUICK = ["--model", "linear", "--max-steps", "10", "--eval-every", "0", "--no-download", "--no-export",
         "--no-save-checkpoints", "--eval-batch-size", "5000"]  # fmt: skip


def test_deepspeed_launcher_without_a_json_is_ddp_and_says_so(tmp_path):
    """Two CPU processes from DeepSpeed's launcher (a one-host hostfile; --no_ssh starts them here)."""
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    prefix = deepspeed("--hostfile", str(hostfile), "--no_ssh", "--node_rank", "0", "--master_addr", "127.0.0.1")
    proc, results = launch(prefix, QUICK, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "--local_rank=1" in proc.stdout + proc.stderr  # what the launcher passed to the second process
    assert (results["distributed_type"], results["num_processes"], results["zero_stage"]) == ("MULTI_CPU", 2, 0)
    assert first_line(proc) == "strategy: DDP (MULTI_CPU); precision: fp32; world size: 2; device: cpu"
    said = [line for line in proc.stderr.splitlines() if "without --deepspeed_config" in line]
    assert len(said) == 1 and "trains without DeepSpeed (MULTI_CPU)" in said[0], proc.stderr[-3000:]


def test_a_json_under_accelerate_launch_of_ddp_is_refused(tmp_path):
    """accelerate launch with a non-DeepSpeed config: found from the launcher's own command line."""
    out = tmp_path / "never" / "run"
    launch_args = ["--config_file", str(CONFIGS / "cpu.yaml")]
    proc, _ = accelerate_launch(launch_args, [*QUICK, "--deepspeed_config", DS_JSON], out)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "the accelerate config asks for the CPU alone" in errors[0], proc.stderr[-3000:]
    # accelerate's simple launcher adds a traceback of its own for the worker's exit code 2; the worker has none.
    assert "for DeepSpeed" in errors[0] and "Traceback" not in proc.stderr.split(errors[0])[0]
    assert not (tmp_path / "never").exists()


@pytest.mark.gpu
def test_seed_json_under_torchrun_and_python_m_on_one_gpu(tmp_path):
    """The post's JSON unchanged (fp16, ZeRO-2, batch 64) on one GPU: torchrun's process and a
    process of its own (python -m, NCCL on a group of one) train alike."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    seed = str(REPO / "examples" / "deepspeed" / "ds_config.json")
    args = ["--model", "linear", "--lr", "3e-4", "--max-steps", "300", "--eval-every", "150", "--no-download",
            "--no-save-checkpoints", "--no-plots", "--deepspeed_config", seed]  # fmt: skip
    got = {}
    for name, prefix in (("torchrun", torchrun(1)), ("python", [sys.executable, "-m"])):
        proc, results = launch(prefix, args, tmp_path / name)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert first_line(proc) == "strategy: DeepSpeed ZeRO-2; precision: fp16; world size: 1; device: cuda"
        assert (results["distributed_type"], results["mixed_precision"], results["global_batch_size"]) == (
            "DEEPSPEED", "fp16", 64)  # fmt: skip
        assert results["test_accuracy"] > 0.8  # 300 steps of Adam 3e-4; an untrained model scores about 0.1
        got[name] = rows(tmp_path / name)
    assert_parity(got["python"], got["torchrun"], "python -m vs torchrun, seed JSON, 1 GPU")
