"""Progress and logs: a bar only on a terminal, one line per evaluation, --quiet, --log-level."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import MNIST_DIR, REPO

ARGS = ["train", "--model", "linear", "--max-steps", "20", "--eval-every", "10", "--no-download",
        "--no-export", "--no-save-checkpoints"]  # fmt: skip


def run(tmp_path, *extra):
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR)}
    return subprocess.run([sys.executable, "-m", "accel_mnist", *ARGS, "--output-dir", str(tmp_path / "o"),
                           "--overwrite", *extra],
                          capture_output=True, text=True, timeout=300, env=env, cwd=REPO)  # fmt: skip


def test_no_bar_without_a_terminal_but_one_line_per_evaluation(tmp_path, mnist_dir):
    proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split()[3].rstrip(":") for line in lines] == ["10", "20"]
    assert "step/s" not in proc.stderr and "step/s" not in proc.stdout  # tqdm's rate: no bar


def test_quiet_turns_off_the_bar_only(tmp_path, mnist_dir):
    """The README's and --help's --quiet: no bar; the evaluations' lines, the run's result, still print."""
    proc = run(tmp_path, "--quiet")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert [line.split()[3].rstrip(":") for line in lines] == ["10", "20"]
    assert "step/s" not in proc.stderr


def test_log_level_debug_reaches_the_libraries(tmp_path, mnist_dir):
    """Libraries log at warnings unless debugging: then Accelerate's own lines about the saved
    checkpoint (INFO) come through too."""
    with_checkpoint = [a for a in ARGS if a != "--no-save-checkpoints"]
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR)}

    def launch(*extra):
        return subprocess.run([sys.executable, "-m", "accel_mnist", *with_checkpoint, "--output-dir",
                               str(tmp_path / "o"), "--overwrite", "--quiet", *extra],
                              capture_output=True, text=True, timeout=300, env=env, cwd=REPO)  # fmt: skip

    quiet, debug = launch(), launch("--log-level", "debug")
    assert debug.returncode == 0, debug.stderr[-2000:]
    assert "accelerate.checkpointing" in debug.stderr and "accelerate.checkpointing" not in quiet.stderr


@pytest.mark.parametrize("quiet", [False, True])
def test_bar_on_a_terminal_unless_quiet(tmp_path, mnist_dir, quiet):
    import fcntl
    import pty
    import struct
    import termios

    main, secondary = pty.openpty()
    # A new pty is 0 columns wide, and the bar fits itself to the width.
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR)}
    proc = subprocess.Popen([sys.executable, "-m", "accel_mnist", *ARGS, "--output-dir", str(tmp_path / "o"),
                             *(["--quiet"] if quiet else [])],
                            stdout=subprocess.DEVNULL, stderr=secondary, env=env, cwd=REPO)  # fmt: skip
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=300) == 0
    assert (b"step/s" in out or b"s/step" in out) is not quiet, out[-2000:]
