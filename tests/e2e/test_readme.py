"""README.md's "## Library use" snippet runs as written, also where `make train` left a finished outputs/cnn."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from accel_mnist import TrainConfig, train
from tests.helpers import REPO


def library_snippet() -> str:
    """The python block of README.md's "## Library use" section."""
    section = (REPO / "README.md").read_text().split("\n## Library use\n", 1)[1].split("\n## ", 1)[0]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found, "no python block in README.md's Library use section"
    return found.group(1)


def test_the_readme_library_snippet_runs_after_a_finished_run(tmp_path, mnist_dir):
    # What `make train` leaves (a short run here): a finished run in outputs/cnn.
    finished = tmp_path / "outputs" / "cnn"
    train(TrainConfig(model="linear", max_steps=5, data_dir=str(mnist_dir), output_dir=str(finished), quiet=True,
                      plots=False, export=False))  # fmt: skip
    results = (finished / "results.json").read_bytes()
    (tmp_path / "snippet.py").write_text(library_snippet())
    env = {**os.environ, "ACCEL_MNIST_DATA_DIR": str(mnist_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "snippet.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # Its UsageError names the TrainConfig fields, not the command line's flags.
    assert 'pass resume_from="auto" to continue it, overwrite=True to replace it' in proc.stdout, proc.stdout[-2000:]
    assert (finished / "results.json").read_bytes() == results  # the earlier run is left as it was
