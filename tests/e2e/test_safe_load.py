"""A checkpoint from elsewhere runs no code on resume, and its RNG states come back or the resume
stops. Here: one process, its run on the synthetic MNIST files.

Every file a checkpoint holds is replaced in turn by a pickle whose __reduce__ would create a
marker file; the resume must stop with one `error:` line naming that file, before anything in
the output directory changes, and the marker must never appear."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from accel_mnist import TrainConfig, train
from accel_mnist.errors import UsageError
from accel_mnist.run import checkpoint as ckpt
from tests.helpers import error_lines, plant, run_accel_mnist, snapshot, synthetic_counts

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_safe_load.py")

TRAIN_ARGS = ["--model", "mlp", "--max-steps", "8", "--checkpoint-every", "4", "--eval-every", "0",
              "--no-download", "--quiet", "--no-export", "--eval-batch-size", "5000"]  # fmt: skip


def cli(out: Path, *extra: str):
    """The run's command, on the real MNIST files (a subprocess expects their record counts)."""
    return run_accel_mnist("train", *TRAIN_ARGS, "--output-dir", str(out), *extra)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory, synthetic_mnist_files) -> Path:
    out = tmp_path_factory.mktemp("single") / "run"
    config = TrainConfig(model="mlp", data_dir=str(synthetic_mnist_files), download=False, quiet=True, export=False,
                         output_dir=str(out), max_steps=8, checkpoint_every=4, eval_batch_size=5000)  # fmt: skip
    with synthetic_counts():
        train(config)
    (out / "results.json").unlink()  # as if killed after step 8's checkpoint
    return out


@pytest.fixture
def run_copy(single_run, synthetic_mnist, tmp_path) -> tuple[Path, Path, TrainConfig]:
    """A fresh copy of the run, its step_4 checkpoint, and the config that resumes from it."""
    out = tmp_path / "run"
    shutil.copytree(single_run, out)
    step_4 = ckpt.checkpoint_dir(out) / "step_4"
    config = TrainConfig(model="mlp", data_dir=str(synthetic_mnist), download=False, quiet=True, export=False,
                         output_dir=str(out), max_steps=8, checkpoint_every=4, eval_batch_size=5000,
                         resume_from=str(step_4))  # fmt: skip
    return out, step_4, config


SINGLE_FILES = ["optimizer.bin", "scheduler.bin", "random_states_0.pkl", "model.safetensors",
                # ema_decay's average (training/averaging.py); then files this project does not write, but
                # load_state reads when present
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


def test_bare_pickle_is_refused_and_cli_says_one_line(run_copy, tmp_path, mnist_dir):
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


def test_genuine_checkpoint_resumes_by_default(run_copy):
    out, step_4, config = run_copy
    assert train(config)["steps"] == 8
