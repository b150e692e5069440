"""`accel-mnist estimate --model package.module:callable`, the console script run beside the package, imports it
as `python -m accel_mnist` does."""

from __future__ import annotations

import json
import os
import subprocess

from tests.helpers import console_script
from tests.unit.test_model_from_path import PACKAGE, write_package


def test_the_console_script_imports_a_package_beside_the_user(tmp_path):
    write_package(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"OMP_NUM_THREADS": "1"}
    cmd = [console_script("accel-mnist"), "estimate", "--model", f"{PACKAGE}.models:build", "--fits", "8e9", "--json"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    printed = json.loads(proc.stdout)
    assert printed["num_parameters"] == 28 * 28 * 10 + 10
    assert all(row["fits"] for row in printed["per_process"].values())
