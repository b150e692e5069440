"""Checkpoints and resume in one process: a crash inside a save, NaN, bad checkpoints, and what a
resume may and may not continue. The runs read the synthetic MNIST files (what they check does
not depend on the data), but for the one a command resumes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from accel_mnist import TrainConfig, train
from accel_mnist.errors import EXIT_OUT_OF_MEMORY, NonFiniteLossError, OutOfMemory, UsageError
from accel_mnist.run import checkpoint as ckpt
from tests.helpers import run_command


def _config(data_dir, tmp_path):
    return TrainConfig(model="linear", data_dir=str(data_dir), download=False, quiet=True, export=False,
                       output_dir=str(tmp_path / "run"), max_steps=60, checkpoint_every=20, eval_every=20)  # fmt: skip


@pytest.fixture
def config(synthetic_mnist, tmp_path):
    return _config(synthetic_mnist, tmp_path)


@pytest.fixture
def mnist_config(mnist_dir, tmp_path):
    """On the real files: a command in a subprocess (which expects their record counts) resumes the run."""
    return _config(mnist_dir, tmp_path)


def test_crash_inside_a_save_keeps_the_previous_checkpoint(config, monkeypatch):
    from accelerate import Accelerator

    real_save, calls = Accelerator.save_state, []

    def failing_save(self, output_dir=None, **kwargs):
        calls.append(output_dir)
        result = real_save(self, output_dir, **kwargs)  # the files are written...
        if len(calls) == 2:
            raise OSError("disk full")  # ...but the save dies before it completes
        return result

    monkeypatch.setattr(Accelerator, "save_state", failing_save)
    with pytest.raises(OSError, match="disk full"):
        train(config)
    assert [p.name for p in ckpt.list_checkpoints(config.output_dir)] == ["step_20"]
    assert ckpt.resolve_checkpoint("latest", config.output_dir).name == "step_20"
    monkeypatch.setattr(Accelerator, "save_state", real_save)
    results = train(config.replace(resume_from="latest"))
    assert results["steps"] == 60
    assert not list(ckpt.checkpoint_dir(config.output_dir).glob(".tmp_*"))


class NaNAfter(nn.Module):
    """A linear model whose output turns NaN from its `bad_from`-th training forward on."""

    def __init__(self, bad_from: int):
        super().__init__()
        self.fc, self.calls, self.bad_from = nn.Linear(784, 10), 0, bad_from

    def forward(self, x):
        self.calls += self.training
        out = self.fc(x.flatten(1))
        return out * float("nan") if self.training and self.calls >= self.bad_from else out


def test_persistent_nan_stops_and_keeps_the_last_good_checkpoint(config):
    bad = config.replace(max_nonfinite=3, log_every=1, eval_every=0)
    with pytest.raises(NonFiniteLossError, match="not finite for 3 optimizer steps"):
        train(bad, model=NaNAfter(bad_from=25))
    last = ckpt.list_checkpoints(config.output_dir)[-1]
    assert last.name == "step_20"
    weights = load_file(next(last.glob("*.safetensors")))
    assert all(torch.isfinite(t).all() for t in weights.values())


class OutOfMemoryAt(nn.Module):
    """A linear model whose `bad_from`-th training forward runs out of (accelerator) memory."""

    def __init__(self, bad_from: int):
        super().__init__()
        self.fc, self.calls, self.bad_from = nn.Linear(784, 10), 0, bad_from

    def forward(self, x):
        self.calls += self.training
        if self.training and self.calls >= self.bad_from:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.fc(x.flatten(1))


def test_out_of_memory_ends_in_one_line_and_keeps_the_last_checkpoint(config):
    with pytest.raises(OutOfMemory) as excinfo:
        train(config.replace(eval_every=0), model=OutOfMemoryAt(bad_from=25))
    message, last = str(excinfo.value), ckpt.list_checkpoints(config.output_dir)[-1]
    assert excinfo.value.exit_code == EXIT_OUT_OF_MEMORY == 3 and "\n" not in message
    assert message.startswith("out of CPU memory after step 24 at batch 64 per process")
    assert last.name == "step_20" and f"the last checkpoint {last} is kept" in message
    # The run can go on from there at a batch that fits.
    results = train(config.replace(resume_from="latest", max_steps=30, eval_every=0), model=OutOfMemoryAt(10**9))
    assert results["steps"] == 30


def test_resume_refuses_another_world_size(config):
    train(config.replace(max_steps=20))
    last = ckpt.list_checkpoints(config.output_dir)[-1]
    state = json.loads((last / ckpt.STATE_FILE).read_text())
    state["strategy"]["num_processes"] = 2
    (last / ckpt.STATE_FILE).write_text(json.dumps(state))
    # Another number of processes is refused only where the global batch changes with it.
    with pytest.raises(UsageError, match=r"global batch of 128 \(batch_size 64 x grad_accum 1 x 2 processes\) "
                       r"but this run has 64; with 1 processes pass batch_size=128 to keep it"):  # fmt: skip
        train(config.replace(resume_from="latest"))
    state["strategy"]["zero_stage"] = 2
    (last / ckpt.STATE_FILE).write_text(json.dumps(state))
    with pytest.raises(UsageError, match="zero_stage=2 but this run has zero_stage=0"):
        train(config.replace(resume_from="latest", batch_size=128))


def test_resume_refuses_another_model(config):
    train(config.replace(max_steps=20))
    with pytest.raises(UsageError, match="model='linear' but this run has model='mlp'"):
        train(config.replace(resume_from="latest", model="mlp"))


@pytest.mark.parametrize("damage", ["no_state", "no_weights", "bad_state"])
def test_corrupt_checkpoint_is_a_one_line_error(mnist_config, damage):
    config = mnist_config
    train(config.replace(max_steps=20))
    last = ckpt.list_checkpoints(config.output_dir)[-1]
    if damage == "no_state":
        (last / ckpt.STATE_FILE).unlink()
    elif damage == "no_weights":
        for f in last.glob("model*.safetensors"):
            f.unlink()
    else:
        (last / ckpt.STATE_FILE).write_text("{not json")
    proc = run_command([sys.executable, "-m", "accel_mnist", "train", "--model", "linear", "--max-steps", "40",
                        "--output-dir", config.output_dir, "--resume-from", str(last), "--quiet"])  # fmt: skip
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(last) in lines[0], proc.stderr[-2000:]


def test_a_fresh_run_does_not_start_over_an_earlier_runs_checkpoints(config):
    train(config.replace(max_steps=20))
    (Path(config.output_dir) / "results.json").unlink()  # as if it had been killed
    with pytest.raises(UsageError, match=r"already holds checkpoints \(step_20\).*resume_from=\"auto\""):
        train(config)
    train(config.replace(overwrite=True, max_steps=40, checkpoint_every=0))  # --overwrite: a new run
    assert [p.name for p in ckpt.list_checkpoints(config.output_dir)] == ["step_40"]


def test_resume_from_an_older_checkpoint_drops_the_newer_ones(config):
    train(config.replace(keep_checkpoints=3))  # step_20, step_40, step_60
    out = Path(config.output_dir)
    (out / "results.json").unlink()
    step_20 = ckpt.checkpoint_dir(out) / "step_20"
    train(config.replace(resume_from=str(step_20), max_steps=50, checkpoint_every=0, keep_checkpoints=3))
    # step_40 and step_60 belonged to the earlier future; latest must be this run's end.
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_20", "step_50"]


def test_resuming_a_finished_run_keeps_its_results(config):
    train(config)
    results = (Path(config.output_dir) / "results.json").read_text()
    with pytest.raises(UsageError, match="already at step 60 of 60"):
        train(config.replace(resume_from="latest"))
    assert (Path(config.output_dir) / "results.json").read_text() == results


def test_a_sized_schedule_cannot_be_stretched_on_resume(config):
    onecycle = config.replace(scheduler="onecycle")
    with pytest.raises(OSError):  # die after the first checkpoint (step 20)
        _train_dying_in_save(onecycle, save_number=2)
    with pytest.raises(UsageError, match="onecycle schedule over 60 steps but this run has 100"):
        train(onecycle.replace(resume_from="latest", max_steps=100))
    assert train(onecycle.replace(resume_from="latest"))["steps"] == 60


def _train_dying_in_save(config, save_number):
    from unittest import mock

    from accelerate import Accelerator

    real, calls = Accelerator.save_state, []

    def failing(self, output_dir=None, **kwargs):
        calls.append(1)
        if len(calls) == save_number:
            raise OSError("disk full")
        return real(self, output_dir, **kwargs)

    with mock.patch.object(Accelerator, "save_state", failing):
        train(config)
