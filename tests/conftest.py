"""Shared pytest fixtures."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

MNIST_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnist"


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
