"""The benchmark tools that run without a GPU, as commands: their bookkeeping, not their timings."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks import runner
from tests.helpers import REPO


def test_zero_step_overhead_rejects_an_unknown_variant():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.zero_step_overhead", "--variants", "zero9"],
                          capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert proc.returncode != 0 and "error: unknown variant(s) zero9" in proc.stderr


@pytest.mark.slow
def test_zero_step_overhead_records_each_variant_on_cpu(tmp_path, mnist_dir, monkeypatch):
    monkeypatch.setenv("ACCEL_MNIST_DATA_DIR", str(mnist_dir))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cmd = [sys.executable, "-m", "benchmarks.zero_step_overhead", "--steps", "5", "--repeats", "1",
           "--variants", "plain_amp,zero2", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = {json.loads(p.read_text())["variant"]: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert set(records) == {"plain_amp", "zero2"}
    for record in records.values():
        assert record["precision"] == "fp32" and record["processes"] == 1 and record["ms_per_step"] > 0
    assert "ms/step (1 process(es)): plain_amp" in proc.stdout


def test_run_once_fills_runs_parses_and_cleans_up(tmp_path):
    script = ("import json, sys; from pathlib import Path; run = Path(sys.argv[1]); "
              "row = {'step': 5, 'train_seconds': 0.5, 'test_accuracy': 0.99, 'epoch': 1.0}; "
              "(run / 'metrics.jsonl').write_text(json.dumps(row) + '\\n')")  # fmt: skip
    row = {"name": "fake", "group": "g", "what": "w", "cmd": ["{python}", "-c", script, "{run}"], "parse": "curve",
           "target": 0.99, "env": {"FAKE_ENV": "1"}}  # fmt: skip
    ctx = runner.context(tmp_path, None)
    record = runner.run_once(row, {"index": 0, "seed": 3}, ctx, tmp_path, timeout=120)
    assert record["rc"] == 0 and record["env"] == {"FAKE_ENV": "1"}
    assert record["parsed"]["reached"] and record["parsed"]["seconds_to_target"] == 0.5
    assert str(tmp_path / "runs" / "fake-0") in record["command"]
    assert not (tmp_path / "runs" / "fake-0").exists()  # parsed, then the run's folder goes
    failing = {**row, "cmd": ["{python}", "-c", "raise SystemExit(3)"]}
    assert runner.run_once(failing, {"index": 1, "seed": 0}, ctx, tmp_path, timeout=120)["rc"] == 3
