"""The benchmark tools that run without a GPU, as commands: their bookkeeping, not their timings."""

from __future__ import annotations

from benchmarks import runner


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
