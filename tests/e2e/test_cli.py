"""The command line: exit codes and one-line errors for bad input, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


def run_cli(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "accel_mnist", *args],
        capture_output=True, text=True, timeout=300, cwd=cwd,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


def assert_one_line_error(proc, *needles):
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unknown_flag():
    assert_one_line_error(run_cli("train", "--batchsize", "3"), "--batchsize")


def test_bad_value():
    assert_one_line_error(run_cli("train", "--epochs", "zero"), "--epochs", "expected int")


def test_missing_subcommand():
    assert_one_line_error(run_cli(), "command")


def test_bad_choice():
    assert_one_line_error(run_cli("train", "--model", "resnet"), "model", "resnet")


def test_unknown_key_in_config_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("lerning_rate: 0.1\n")
    assert_one_line_error(run_cli("train", "--config", str(path)), "lerning_rate")


def test_missing_data_without_download(tmp_path):
    proc = run_cli("train", "--data-dir", str(tmp_path / "nowhere"), "--no-download",
                   "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert_one_line_error(proc, "nowhere")


def test_corrupt_data_file(tmp_path, mnist_dir):
    for f in mnist_dir.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    labels = tmp_path / "t10k-labels-idx1-ubyte.gz"
    labels.write_bytes(labels.read_bytes()[:-100])
    proc = run_cli("train", "--data-dir", str(tmp_path), "--output-dir", str(tmp_path / "out"))
    assert_one_line_error(proc, "t10k-labels-idx1-ubyte.gz")


def test_batch_size_auto_without_a_gpu_says_why_and_writes_nothing(tmp_path, mnist_dir):
    out = tmp_path / "run"
    proc = run_cli("train", "--batch-size", "auto", "--data-dir", str(mnist_dir), "--no-download",
                   "--output-dir", str(out), env={"CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert_one_line_error(proc, "batch_size auto needs a GPU")
    assert not out.exists()
    assert_one_line_error(run_cli("train", "--batch-size", "0"), "--batch-size: must be >= 1 or auto")


def test_finished_run_is_not_overwritten(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text(json.dumps({"test_accuracy": 0.99}))
    proc = run_cli("train", "--output-dir", str(out))
    assert_one_line_error(proc, "--overwrite")
    assert json.loads((out / "results.json").read_text()) == {"test_accuracy": 0.99}


def test_debug_shows_the_traceback(tmp_path):
    proc = run_cli("--debug", "train", "--data-dir", str(tmp_path), "--no-download",
                   "--output-dir", str(tmp_path / "out"))  # fmt: skip
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_help_lists_the_subcommand():
    proc = run_cli("--help")
    assert proc.returncode == 0 and "train" in proc.stdout


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("accel-mnist")
    proc = subprocess.run([str(script), "train", "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "--grad-accum" in proc.stdout
