"""Shared pytest fixtures."""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np
import pytest

# The real MNIST files beside the checkout; ACCEL_MNIST_DATA_DIR where they lie elsewhere (the
# GPU machine, where the checkout travels without ../shared).
MNIST_DIR = Path(
    os.environ.get("ACCEL_MNIST_DATA_DIR") or Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"
)


@pytest.fixture
def mnist_dir() -> Path:
    """The real MNIST IDX files (../shared/data/mnist from the repo root); skips when absent."""
    if not (MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    return MNIST_DIR


def _write_idx(path, array, *, gz: bool = False, code: int = 0x08, tail: bytes = b"", cut: int = 0):
    """Write `array` as an IDX file (big-endian); `tail` appends bytes, `cut` drops trailing ones."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.asarray(array)
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(array.dtype.newbyteorder(">")).tobytes() + tail
    payload = payload[: len(payload) - cut]
    path.write_bytes(gzip.compress(payload) if gz else payload)
    return path


@pytest.fixture
def write_idx():
    """Returns write_idx(path, array, *, gz=False, code=0x08, tail=b"", cut=0) -> Path."""
    return _write_idx


# metrics.jsonl keys that measure time (and the memory peak, which moves alike from run to run):
# left out wherever two runs' metrics are compared.
TIMING_KEYS = frozenset(
    {"samples_per_second", "train_seconds", "warmup_seconds", "steady_samples_per_second", "peak_allocated_bytes"}
)

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "accelerate_configs"


def accelerate_launch(launch_args, train_args, output_dir, *, env=None, timeout=600):
    """Run `accelerate launch <launch_args> -m accel_mnist train <train_args>` in a subprocess.

    Returns (CompletedProcess, results dict or None). On CPU the DeepSpeed configs need
    `--mixed_precision no` among launch_args (fp16 does not run on CPU).
    """
    import json
    import os
    import subprocess
    import sys

    accelerate = Path(sys.executable).with_name("accelerate")
    cmd = [str(accelerate), "launch", *launch_args, "-m", "accel_mnist", "train",
           *train_args, "--output-dir", str(output_dir), "--quiet"]  # fmt: skip
    full_env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(MNIST_DIR), "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
    results_file = Path(output_dir) / "results.json"
    results = json.loads(results_file.read_text()) if results_file.exists() else None
    return proc, results
