"""A checkpoint from elsewhere runs no code on resume, and its RNG states come back or the resume stops.

Every file a checkpoint holds is replaced in turn by a pickle whose __reduce__ would create a
marker file; the resume must stop with one `error:` line naming that file, before anything in
the output directory changes, and the marker must never appear.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from accel_mnist import TrainConfig, train
from accel_mnist.errors import UsageError
from accel_mnist.run import checkpoint as ckpt
from accel_mnist.run.safe_load import load_file, verify_checkpoint
from tests.helpers import CONFIGS, MNIST_DIR, REPO

ZERO2 = ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"]
TRAIN_ARGS = ["--model", "mlp", "--max-steps", "8", "--checkpoint-every", "4", "--eval-every", "0",
              "--no-download", "--quiet", "--no-export", "--eval-batch-size", "5000"]  # fmt: skip


class Planted:
    """Unpickling this creates `marker`: what a hostile checkpoint could do instead."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def plant(file: Path, marker: Path, *, bare: bool = False) -> None:
    """Replace `file` by a planted pickle: torch.save's zip format, or a bare pickle."""
    file.unlink(missing_ok=True)
    if bare:
        file.write_bytes(pickle.dumps({"state": Planted(marker)}, protocol=2))
    else:
        torch.save({"state": Planted(marker)}, file)


def env() -> dict[str, str]:
    return {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1"}


def cli(out: Path, *extra: str, launch: list[str] | None = None) -> subprocess.CompletedProcess:
    args = ["-m", "accel_mnist", "train", *TRAIN_ARGS, "--output-dir", str(out), *extra]
    cmd = [sys.executable, *args] if launch is None else [str(Path(sys.executable).with_name("accelerate")),
                                                           "launch", *launch, *args]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env(), cwd=REPO)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.startswith("error:")]


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file of the output directory and its bytes: a refused resume may change none."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


# --- one process ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def single_run(tmp_path_factory) -> Path:
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    out = tmp_path_factory.mktemp("single") / "run"
    config = TrainConfig(model="mlp", data_dir=str(MNIST_DIR), download=False, quiet=True, export=False,
                         output_dir=str(out), max_steps=8, checkpoint_every=4, eval_batch_size=5000)  # fmt: skip
    train(config)
    (out / "results.json").unlink()  # as if killed after step 8's checkpoint
    return out


@pytest.fixture
def run_copy(single_run, tmp_path) -> tuple[Path, Path, TrainConfig]:
    """A fresh copy of the run, its step_4 checkpoint, and the config that resumes from it."""
    out = tmp_path / "run"
    shutil.copytree(single_run, out)
    step_4 = ckpt.checkpoint_dir(out) / "step_4"
    config = TrainConfig(model="mlp", data_dir=str(MNIST_DIR), download=False, quiet=True, export=False,
                         output_dir=str(out), max_steps=8, checkpoint_every=4, eval_batch_size=5000,
                         resume_from=str(step_4))  # fmt: skip
    return out, step_4, config


SINGLE_FILES = ["optimizer.bin", "scheduler.bin", "random_states_0.pkl", "model.safetensors",
                # not written by this project, but read by load_state when present
                "custom_checkpoint_0.pkl", "sampler.bin", "scaler.pt"]  # fmt: skip


@pytest.mark.parametrize("name", SINGLE_FILES)
def test_planted_pickle_is_refused_single_process(run_copy, tmp_path, name):
    out, step_4, config = run_copy
    marker = tmp_path / "marker"
    plant(step_4 / name, marker)
    before = snapshot(out)
    with pytest.raises(UsageError) as e:
        train(config)
    assert str(step_4 / name) in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()
    assert snapshot(out) == before


def test_bare_pickle_is_refused_and_cli_says_one_line(run_copy, tmp_path):
    out, step_4, _ = run_copy
    marker = tmp_path / "marker"
    plant(step_4 / "optimizer.bin", marker, bare=True)  # torch.load's legacy path unpickles at once
    proc = cli(out, "--resume-from", str(step_4))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(error_lines(proc)) == 1 and "optimizer.bin" in error_lines(proc)[0]
    assert "--trust-checkpoint" in error_lines(proc)[0]
    assert not marker.exists()


def test_trust_checkpoint_lifts_the_allow_list(run_copy, tmp_path):
    out, step_4, config = run_copy
    # A class outside the allow-list in a file nothing reads the object from (the scheduler's
    # state would be replaced): refused by default, loaded once trusted.
    state = torch.load(step_4 / "scheduler.bin", weights_only=True)
    state["note"] = Path("not/allowed")
    torch.save(state, step_4 / "scheduler.bin")
    with pytest.raises(UsageError, match=r"scheduler.bin: holds a pickled pathlib\.\w*Path"):
        train(config)
    results = train(config.replace(trust_checkpoint=True))
    assert results["steps"] == 8


def test_trust_checkpoint_runs_code_it_is_told_to_trust(run_copy, tmp_path):
    """The flag means what it says: a trusted planted pickle does run (so that nothing else is refused)."""
    out, step_4, config = run_copy
    marker = tmp_path / "marker"
    plant(step_4 / "scheduler.bin", marker)
    with pytest.raises(UsageError):  # the planted dict is no scheduler state
        train(config.replace(trust_checkpoint=True))
    assert marker.exists()


@pytest.mark.parametrize("damage", ["missing", "truncated", "no_torch_state", "planted_trusted"])
def test_rng_file_that_cannot_be_restored_stops_the_resume(run_copy, tmp_path, damage):
    out, step_4, config = run_copy
    rng = step_4 / "random_states_0.pkl"
    marker = tmp_path / "marker"
    if damage == "missing":
        rng.unlink()
    elif damage == "truncated":
        rng.write_bytes(rng.read_bytes()[:1000])
    elif damage == "no_torch_state":
        states = torch.load(rng, weights_only=False)
        del states["torch_manual_seed"]
        torch.save(states, rng)
    else:
        plant(rng, marker)  # Accelerate reads RNG files weights-only even when trusted, and skips them
        config = config.replace(trust_checkpoint=True)
    before = snapshot(out)
    with pytest.raises(UsageError, match="random_states_0.pkl"):
        train(config)
    assert not marker.exists()
    assert snapshot(out) == before


def test_rng_states_not_applied_are_an_error(run_copy):
    """An RNG file that loads but that Accelerate fails to apply (a wrong-sized state)."""
    out, step_4, config = run_copy
    rng = step_4 / "random_states_0.pkl"
    states = torch.load(rng, weights_only=False)
    states["torch_manual_seed"] = states["torch_manual_seed"][:10]
    torch.save(states, rng)
    with pytest.raises(UsageError, match="RNG states were not restored"):
        train(config)


def test_bare_pickle_of_a_newer_protocol_is_refused(tmp_path):
    path = tmp_path / "x.pkl"
    path.write_bytes(pickle.dumps({"state": Planted(tmp_path / "marker")}, protocol=4))
    with pytest.raises(UsageError, match=r"x.pkl: corrupt, or not loadable without unpickling .*\(Unsupported"):
        load_file(path, [])
    assert not (tmp_path / "marker").exists()


def test_genuine_checkpoint_resumes_by_default(run_copy):
    out, step_4, config = run_copy
    assert train(config)["steps"] == 8


def test_load_file_names_the_refused_global(tmp_path):
    path = tmp_path / "x.pt"
    plant(path, tmp_path / "marker")
    with pytest.raises(UsageError, match=r"x.pt: holds a pickled (builtins|io)\.open"):
        load_file(path, [])
    assert not (tmp_path / "marker").exists()


def test_planted_fsdp_metadata_is_refused_before_any_load(tmp_path):
    # torch.distributed.checkpoint reads .metadata with plain pickle.load, so a resume of an
    # FSDP sharded checkpoint checks it with the allow-list unpickler first.
    shards = tmp_path / "pytorch_model_fsdp_0"
    shards.mkdir()
    plant(shards / ".metadata", tmp_path / "marker", bare=True)
    with pytest.raises(UsageError, match=r"\.metadata: holds a pickled (builtins|io)\.open"):
        verify_checkpoint(tmp_path, 0, trust=False)
    assert not (tmp_path / "marker").exists()


def test_verify_checkpoint_reports_a_missing_rng_file(tmp_path):
    with pytest.raises(UsageError, match="random_states_3.pkl: missing"):
        verify_checkpoint(tmp_path, 3, trust=False)


# --- DeepSpeed ZeRO-2, two CPU processes ---------------------------------------------------------


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory) -> Path:
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    out = tmp_path_factory.mktemp("zero2") / "run"
    proc = cli(out, launch=ZERO2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (out / "results.json").unlink()
    return out


ZERO2_FILES = ["pytorch_model/mp_rank_00_model_states.pt", "pytorch_model/zero_pp_rank_0_mp_rank_00_optim_states.pt",
               "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt", "random_states_1.pkl",
               "scheduler.bin"]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("name", ZERO2_FILES)
def test_planted_pickle_is_refused_under_zero2(zero2_run, tmp_path, name):
    out = tmp_path / "run"
    shutil.copytree(zero2_run, out)
    step_4 = ckpt.checkpoint_dir(out) / "step_4"
    marker = tmp_path / "marker"
    plant(step_4 / name, marker)
    before = snapshot(out)
    proc = cli(out, "--resume-from", str(step_4), launch=ZERO2)
    assert proc.returncode != 0
    # Both ranks stop with the same line (the first rank's problem), whichever rank found it.
    lines = set(error_lines(proc))
    assert len(lines) == 1 and str(step_4 / name) in lines.pop(), proc.stderr[-3000:]
    assert not marker.exists()
    assert snapshot(out) == before


@pytest.mark.slow
@pytest.mark.parametrize("trust", [False, True])
def test_genuine_zero2_checkpoint_resumes(zero2_run, tmp_path, trust):
    out = tmp_path / "run"
    shutil.copytree(zero2_run, out)
    step_4 = ckpt.checkpoint_dir(out) / "step_4"
    proc = cli(out, "--resume-from", str(step_4), *(["--trust-checkpoint"] if trust else []), launch=ZERO2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "results.json").read_text())["steps"] == 8
