"""examples/notebook_launch.py starts its two CPU processes as a user would run it."""

from __future__ import annotations

import json

import pytest

from tests.helpers import run_example


@pytest.mark.slow
def test_notebook_launch_on_two_cpu_processes(tmp_path, mnist_dir):
    out = run_example("notebook_launch.py", "--max-steps", "20", "--output-dir", str(tmp_path / "run"))
    assert "MULTI_CPU on 2 processes" in out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert (results["num_processes"], results["steps"], results["global_batch_size"]) == (2, 20, 128)
