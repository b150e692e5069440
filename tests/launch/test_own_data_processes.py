"""Your own torch Dataset on two processes (DDP over gloo) gives the same metrics as the same
data through an `hf:` folder: the same sharding, and gather_for_metrics counting every test
image once, on the device path and on the torch DataLoader path."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers import CONFIGS, REPO, launch_prefix, metrics_rows
from tests.your_model_data import save_hf, splits

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).with_name("own_data_script.py")


def launch(out, *args):
    cmd = [*launch_prefix(["--config_file", str(CONFIGS / "multi_cpu.yaml")]), str(SCRIPT), str(out), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((out / "results.json").read_text()), metrics_rows(out)


def test_a_torch_dataset_on_two_processes_matches_hf(tmp_path):
    pytest.importorskip("datasets")
    from tests.launch.own_data_script import TEST, TRAIN

    spec = save_hf(tmp_path / "data", splits(10, TRAIN, TEST))
    hf, hf_rows = launch(tmp_path / "hf", "--hf", spec)
    assert (hf["num_processes"], hf["distributed_type"], hf["data_loader"]) == (2, "MULTI_CPU", "device")
    assert [row["test_samples"] for row in hf_rows] == [TEST, TEST]  # the padding of the last shards dropped
    for loader in ("auto", "torch"):
        own, own_rows = launch(tmp_path / loader, "--data-loader", loader)
        assert own["data_loader"] == ("device" if loader == "auto" else "torch")
        assert own["dataset"] == "own:PairDataset" and own["num_processes"] == 2
        assert own_rows == hf_rows, loader
        assert own["confusion_matrix"] == hf["confusion_matrix"]
    assert hf["test_accuracy"] > 0.5  # learned (chance: 0.1)
