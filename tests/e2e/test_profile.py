"""`--profile N` on one process: the trace, the printed table and results.json's `profile`; a window
the run cannot fill is refused before anything is written (the launched strategies: tests/launch)."""

from __future__ import annotations

import json

import pytest

from accel_mnist import TrainConfig, train
from accel_mnist.cli import main


def test_a_profiled_run_writes_a_trace_and_says_where_its_steps_went(synthetic_mnist, tmp_path, capsys):
    out = tmp_path / "run"
    config = TrainConfig(model="cnn", max_steps=6, batch_size=32, eval_batch_size=500, data_dir=str(synthetic_mnist),
                         output_dir=str(out), save_checkpoints=False, export=False, plots=False, profile=3)  # fmt: skip
    found = train(config)["profile"]
    assert found["steps"] == 3 and found["time"] == "cpu" and found["device_us_per_step"] is None
    assert found["us_per_step"] > 0 and found["aten_ops_per_step"] > 10  # a CNN's forward, backward and Adam
    assert 0 < len(found["top"]) <= 8 and all(row["self_us"] >= 0 and row["calls"] > 0 for row in found["top"])
    assert any("conv" in row["name"] for row in found["top"]), found["top"]
    trace = json.loads((out / "profile" / "profile_0.json").read_text())
    steps = {e["name"] for e in trace["traceEvents"] if e.get("name", "").startswith("ProfilerStep")}
    assert len(steps) == 3, steps  # the window: steps after the first and the profiler's warm-up
    printed = capsys.readouterr().out
    assert f"profile: 3 steps, {found['us_per_step']} us a step" in printed and found["trace"] in printed
    # Off by default: nothing recorded, nothing written.
    plain = train(config.replace(profile=0, output_dir=str(tmp_path / "plain")))
    assert "profile" not in plain and not (tmp_path / "plain" / "profile").exists()


def test_the_window_leaves_out_evaluations_and_checkpoints(synthetic_mnist, tmp_path, capsys):
    """An evaluation (or a checkpoint) inside the window would add its operations to the step's."""
    base = TrainConfig(model="linear", max_steps=12, batch_size=32, eval_batch_size=100, data_dir=str(synthetic_mnist),
                       output_dir=str(tmp_path / "plain"), export=False, plots=False, profile=2)  # fmt: skip
    plain = train(base.replace(save_checkpoints=False))["profile"]
    busy = train(base.replace(output_dir=str(tmp_path / "busy"), eval_every=3, checkpoint_every=4))["profile"]
    assert plain["interrupted"] is busy["interrupted"] is False
    assert busy["aten_ops_per_step"] == plain["aten_ops_per_step"]
    # Evaluations after every step: no window is free of them, and the table says so.
    capsys.readouterr()
    every = train(base.replace(output_dir=str(tmp_path / "every"), eval_every=1, save_checkpoints=False))["profile"]
    assert every["interrupted"] is True and every["aten_ops_per_step"] > plain["aten_ops_per_step"]
    assert "without an evaluation or a checkpoint" in capsys.readouterr().out


@pytest.mark.parametrize("argv, said", [
    (["--max-steps", "3", "--profile", "3"], "error: profile: 3 steps after the first need at least 4 optimizer "
                                            "steps, and this run has 3"),
    (["--max-steps", "3", "--profile", "-1"], "error: profile: must be >= 0, got -1"),
])  # fmt: skip
def test_a_window_the_run_cannot_fill_is_refused_in_one_line(synthetic_mnist, tmp_path, capsys, argv, said):
    out = tmp_path / "run"
    code = main(["train", "--model", "linear", "--data-dir", str(synthetic_mnist), "--output-dir", str(out), *argv])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err == said and not (out / "config.json").exists()
