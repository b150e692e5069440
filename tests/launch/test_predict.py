"""`accel-mnist evaluate` of an exported model on two processes."""

from __future__ import annotations

import pytest

from tests.helpers import CONFIGS, MNIST_DIR, assert_summary, real_mnist_present, run_accel_mnist, train_and_export

# Its module-scoped runs are made once: under `pytest -n` (make test) the module stays on one worker.
pytestmark = pytest.mark.xdist_group("launch/test_predict.py")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(export dir, training results) of a linear model trained for 200 steps on the real files."""
    if not real_mnist_present():
        pytest.skip(f"real MNIST files not found at {MNIST_DIR}")
    return train_and_export(tmp_path_factory.mktemp("predict"))


@pytest.mark.slow
def test_cli_evaluate_on_two_processes(exported):
    path, results = exported
    launch = ["--config_file", str(CONFIGS / "multi_cpu.yaml")]
    # 10000 / (2 * 3333) is not whole: even sharding pads, and the padding is not counted.
    proc = run_accel_mnist("evaluate", "--model-path", str(path), "--data-dir", str(MNIST_DIR), "--batch-size", "3333",
                           launch=launch)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert_summary(proc.stdout, results)
