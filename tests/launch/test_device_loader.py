"""DeviceLoader outside Accelerate's prepare, under a two-process DeepSpeed ZeRO-2 launch."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import REPO, launch_prefix
from tests.unit import test_device_loader_equivalence as equivalence
from tests.unit.test_device_loader_equivalence import BATCHES, SYNCS, TEST

# The unit test's file doubles as the script each process runs (its main()).
EQUIVALENCE_SCRIPT = Path(equivalence.__file__)


@pytest.mark.slow
def test_outside_prepare_under_two_process_deepspeed_zero2():
    """This file as the script under `accelerate launch`: the same checks on each of 2 ZeRO-2 processes."""
    cmd = [*launch_prefix(["--config_file", str(REPO / "accelerate_configs" / "zero2.yaml"), "--num_processes", "2",
                           "--mixed_precision", "no"]), str(EQUIVALENCE_SCRIPT)]  # fmt: skip
    # A script's own folder heads its sys.path, so this checkout goes on PYTHONPATH (an installed copy may differ).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    report = json.loads(lines[-1])
    assert report["distributed_type"] == "DEEPSPEED" and report["num_processes"] == 2
    assert report["syncs"] == SYNCS and report["count"] == TEST, report
    assert len(report["losses"]) == BATCHES and all(math.isfinite(v) for v in report["losses"]), report
