"""Shared pytest fixtures and hooks (helpers that are not fixtures live in tests/helpers.py).

The tests live in tiers, one folder each, and each test gets its folder's marker:
unit (in-process, no real data), e2e (one process end to end: the CLI in a subprocess,
train() runs), launch (several processes: `accelerate launch`, torchrun, killed runs) and
gpu (needs a CUDA GPU; skipped without one).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import helpers, shared_runs

TIERS = ("unit", "e2e", "launch", "gpu")
TESTS = Path(__file__).resolve().parent


def pytest_configure(config):
    """Stop a `--dist loadgroup` run that pytest-xdist cannot group (pytest-dev/pytest-xdist#1386: from
    pytest 9.2 the group it appends to each node id is dropped): each worker would make a module's
    shared runs again, minutes more, and nothing would say why."""
    if config.getoption("dist", "no") != "loadgroup" or hasattr(config, "workerinput"):
        return
    import xdist

    xdist_version = tuple(int(part) for part in xdist.__version__.split(".")[:3])
    if pytest.version_tuple[:2] >= (9, 2) and xdist_version <= (3, 8, 0):
        raise pytest.UsageError(f"pytest {pytest.__version__} with pytest-xdist {xdist.__version__} does not keep "
                                "--dist loadgroup's groups: install the dev extra (pytest<9.2)")  # fmt: skip


def pytest_collection_modifyitems(config, items):
    cuda = None
    for item in items:
        tier = _tier(item)
        if tier is None:
            continue
        item.add_marker(tier)
        if tier == "gpu":
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


def _tier(item) -> str | None:
    try:
        tier = Path(item.path).resolve().relative_to(TESTS).parts[0]
    except ValueError:  # a test file outside tests/
        return None
    return tier if tier in TIERS else None


@pytest.fixture
def mnist_dir() -> Path:
    """The real MNIST IDX files (../shared/data/mnist from the repo root); skips when absent."""
    if not helpers.real_mnist_present():
        pytest.skip(f"real MNIST files not found at {helpers.MNIST_DIR}")
    return helpers.MNIST_DIR


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """`shared_run(argv)`: the SharedRun of `argv` (shared_runs.OUT for its output folder), run with
    helpers.run_command the first time any test of the session asks for it (tests/shared_runs.py)."""
    root = shared_runs.shared_root(tmp_path_factory)
    return lambda argv: shared_runs.made_once(root, argv, helpers.run_command)


@pytest.fixture(scope="session")
def synthetic_mnist_files(tmp_path_factory) -> Path:
    """The folder of synthetic MNIST IDX files (helpers.SYNTHETIC_TRAIN / SYNTHETIC_TEST images,
    written once a session). Reading them as `mnist` needs helpers.synthetic_counts()."""
    return helpers.write_synthetic_mnist(tmp_path_factory.mktemp("synthetic_mnist"))


@pytest.fixture
def synthetic_mnist(synthetic_mnist_files) -> Iterator[Path]:
    """The synthetic MNIST folder, read as `mnist` during the test (its record counts expected)."""
    with helpers.synthetic_counts():
        yield synthetic_mnist_files


@pytest.fixture
def write_idx():
    """Returns write_idx(path, array, *, gz=False, code=0x08, tail=b"", cut=0) -> Path."""
    return helpers.write_idx


def pytest_collection_finish(session):
    """Freeze what collection imported (torch, accel_mnist, the test modules) for this process's
    in-process train() runs (helpers.freeze_imported_heap says why)."""
    helpers.freeze_imported_heap()
