"""Shared pytest fixtures and hooks (helpers that are not fixtures live in tests/helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import helpers


@pytest.fixture
def mnist_dir() -> Path:
    """The real MNIST IDX files (../shared/data/mnist from the repo root); skips when absent."""
    if not (helpers.MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST files not found at {helpers.MNIST_DIR}")
    return helpers.MNIST_DIR


@pytest.fixture
def write_idx():
    """Returns write_idx(path, array, *, gz=False, code=0x08, tail=b"", cut=0) -> Path."""
    return helpers.write_idx
