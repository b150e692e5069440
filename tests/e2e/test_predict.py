"""Using a trained and exported model: predictions for pictures of digits, test-set evaluation,
and the `export`, `evaluate` and `predict` subcommands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from accel_mnist import TrainConfig
from accel_mnist.data.catalog import load_split
from accel_mnist.distributed.accelerator import build_accelerator
from accel_mnist.export.model_dir import load_model
from accel_mnist.export.predict import evaluate_exported, predict_files
from tests.helpers import (
    MNIST_DIR,
    REPO,
    assert_summary,
    digit_picture,
    gzip_bomb,
    real_mnist_present,
    run_accel_mnist,
    train_and_export,
)

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("e2e/test_predict.py")

MEAN, STD = 0.1307, 0.3081


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export dir, training results) of a linear model trained for 200 steps on the real files."""
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    return train_and_export(tmp_path_factory.mktemp("predict"))


@pytest.fixture(scope="module")
def model(exported):
    return load_model(exported[0])


@pytest.fixture(scope="module")
def test_split():
    return load_split("mnist", MNIST_DIR, train=False, download=False)


@pytest.mark.parametrize("suffix, options", [(".png", {}), (".jpg", {"quality": 90})])
def test_picture_of_a_digit(model, test_split, tmp_path, suffix, options):
    images, labels = test_split
    path = tmp_path / f"digit{suffix}"
    digit_picture(images[0]).save(path, **options)
    [(name, digit, probability)] = predict_files(model, [path], MEAN, STD)
    assert (name, digit) == (str(path), int(labels[0]))
    assert probability > 0.5  # the 28x28 original's: 0.98


def test_transparent_background(model, test_split, tmp_path):
    images, labels = test_split
    ink = Image.fromarray(images[0].numpy()).resize((56, 56), Image.Resampling.BICUBIC)
    picture = Image.new("RGBA", ink.size, (0, 0, 0, 0))
    picture.putalpha(ink)  # black ink, opaque where the digit is, transparent elsewhere
    picture.save(tmp_path / "digit.png")
    [(_, digit, _)] = predict_files(model, [tmp_path / "digit.png"], MEAN, STD)
    assert digit == int(labels[0])


def test_evaluate_exported_matches_training(exported):
    path, results = exported
    metrics = evaluate_exported(path, data_dir=MNIST_DIR)
    assert metrics["test_samples"] == 10000
    assert metrics["test_accuracy"] == pytest.approx(results["test_accuracy"], abs=1e-4)
    assert metrics["test_loss"] == pytest.approx(results["test_loss"], rel=1e-5)


def assert_cli_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert str(needle) in lines[0]


def test_cli_predict(exported, test_split, tmp_path):
    images, labels = test_split
    digit_picture(images[0]).save(tmp_path / "digit.png")
    proc = run_accel_mnist("predict", "--model-path", str(exported[0]), str(tmp_path / "digit.png"))
    assert proc.returncode == 0, proc.stderr
    name, digit, probability = proc.stdout.strip().split("\t")
    assert (name, int(digit)) == (str(tmp_path / "digit.png"), int(labels[0]))
    assert len(probability.split(".")[1]) == 4 and 0.5 < float(probability) <= 1


def test_cli_predict_error(exported, tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    proc = run_accel_mnist("predict", "--model-path", str(exported[0]), str(tmp_path / "notes.txt"))
    assert_cli_error(proc, tmp_path / "notes.txt", "not an image")
    assert_cli_error(run_accel_mnist("predict", "--model-path", str(tmp_path / "nothing"), "x.png"), "nothing")


def test_cli_evaluate_and_export(exported, tmp_path):
    path, results = exported
    proc = run_accel_mnist("evaluate", "--model-path", str(path), "--data-dir", str(MNIST_DIR), "--batch-size", "3000")
    assert proc.returncode == 0, proc.stderr
    assert_summary(proc.stdout, results)

    accelerator = build_accelerator(TrainConfig())
    accelerator.prepare(load_model(path))
    accelerator.save_state(tmp_path / "ckpt")
    state = {"config": TrainConfig(model="linear").to_dict(), "step": 200}
    (tmp_path / "ckpt" / "trainer_state.json").write_text(json.dumps(state))
    proc = run_accel_mnist("export", "--checkpoint", str(tmp_path / "ckpt"), "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"exported linear (mnist, step 200) to {tmp_path / 'out'}\n"
    proc = run_accel_mnist("export", "--checkpoint", str(tmp_path / "none"), "--output", str(tmp_path / "o"))
    assert_cli_error(proc, "none")


# The CLI in a child process that reports its own peak resident memory (kB) on stdout's last line.
PEAK_RSS_SCRIPT = """
import resource, sys
from accel_mnist.cli import main
code = main(sys.argv[1:])
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def predict_peak_rss(export: Path, path: Path) -> tuple[subprocess.CompletedProcess, int]:
    cmd = [sys.executable, "-c", PEAK_RSS_SCRIPT, "predict", "--model-path", str(export), str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO)
    return proc, int(proc.stdout.strip().splitlines()[-1])


def test_predict_on_gzip_bombs_stays_within_memory(exported, tmp_path, write_idx):
    small = write_idx(tmp_path / "ten-idx3-ubyte.gz", np.zeros((10, 28, 28), np.uint8), gz=True)
    proc, baseline = predict_peak_rss(exported[0], small)
    assert proc.returncode == 0 and proc.stdout.count("\t") == 20, proc.stderr[-2000:]
    # Ten records and then 2 GiB of zeros, from a 2 MB file.
    inflating = gzip_bomb(tmp_path / "inflating.gz", (10, 28, 28), 10 * 784, 2)
    proc, peak = predict_peak_rss(exported[0], inflating)
    assert_cli_error(proc, inflating, "trailing bytes")
    assert peak < baseline + 64 * 1024, f"{peak} kB against {baseline} kB for ten records"
    # A header that declares 2**31 records of 28x28 in a few dozen bytes.
    declaring = gzip_bomb(tmp_path / "declaring.gz", (2**31 - 1, 28, 28), 0, 0)
    proc, peak = predict_peak_rss(exported[0], declaring)
    assert_cli_error(proc, declaring, "over the limit")
    assert peak < baseline + 64 * 1024, f"{peak} kB against {baseline} kB for ten records"
