"""A checkpoint from elsewhere runs no code on resume, and its RNG states come back or the resume
stops. Here: DeepSpeed ZeRO-2 on two CPU processes.

Every file a checkpoint holds is replaced in turn by a pickle whose __reduce__ would create a
marker file; the resume must stop with one `error:` line naming that file, before anything in
the output directory changes, and the marker must never appear."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from accel_mnist.run import checkpoint as ckpt
from tests.helpers import CONFIGS, MNIST_DIR, error_lines, plant, real_mnist_present, run_accel_mnist, snapshot

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("launch/test_safe_load.py")

ZERO2 = ["--config_file", str(CONFIGS / "zero2.yaml"), "--mixed_precision", "no"]
TRAIN_ARGS = ["--model", "mlp", "--max-steps", "8", "--checkpoint-every", "4", "--eval-every", "0",
              "--no-download", "--quiet", "--no-export", "--eval-batch-size", "5000"]  # fmt: skip


def cli(out: Path, *extra: str, launch: list[str]):
    return run_accel_mnist("train", *TRAIN_ARGS, "--output-dir", str(out), *extra, launch=launch)


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory) -> Path:
    if not real_mnist_present():
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
