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


def test_repeat_builds_a_factory_s_model_under_the_seed_as_train_builds_the_registry_s(synthetic_mnist, capsys):
    import json

    from benchmarks import repeat

    def finals(*extra: str) -> list[tuple[float, int]]:
        argv = ["--config", "recipes/fast99_graph.yaml", "--seeds", "3,4", "--warmup-runs", "0",
                "--data-dir", str(synthetic_mnist), "--set", "max_steps=4", "--set", "eval_every=2",
                "--set", "eval_batch_size=100", "--set", "batch_size=32", *extra]  # fmt: skip
        assert repeat.main(argv) == 0
        line = json.loads(capsys.readouterr().out.splitlines()[-1])
        return [(seed["final_accuracy"], seed["steps"]) for seed in line["seeds"]]

    registry = finals()
    assert finals("--model", "accel_mnist.models:BNCNN") == registry  # the same weights, step for step
    assert finals("--model", "benchmarks.variants:bncnn_16") != registry
