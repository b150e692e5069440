"""The benchmark tools that run without a GPU: their bookkeeping, not their timings."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks import memory, report, runner, session_summary
from benchmarks.baselines import plain_pytorch
from benchmarks.suites import SUITES
from tests.helpers import REPO


def _run_folder(root: Path, name: str, results: dict, rows: list[dict], wall: float) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "results.json").write_text(json.dumps(results))
    (root / name / "config.json").write_text(json.dumps({"model": "cnn", "batch_size": 512, "output_dir": "x"}))
    (root / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / f"{name}.wall.json").write_text(json.dumps({"name": name, "rc": 0, "wall_seconds": wall}))


def test_session_summary_steady_throughput_first_99_and_labels(tmp_path):
    runs = tmp_path / "part1"
    (runs / "bench").mkdir(parents=True)
    (runs / "gpus.txt").write_text("NVIDIA H200, 143771 MiB, 580\nNVIDIA H200, 143771 MiB, 580\n")
    (runs / "versions.txt").write_text("3.12.3 2.11.0 1.15.0 0.19.8\n")
    base = {"global_batch_size": 1024, "epochs": 3.0, "num_processes": 2, "samples_per_second": 1000.0, "zero_stage": 2,
            "offload_optimizer": "none", "mixed_precision": "fp16"}  # fmt: skip
    rows = [
        {"epoch": 0.5, "step": 30, "train_seconds": 0.5, "test_accuracy": 0.95},
        {"epoch": 1.0, "step": 59, "train_seconds": 1.0, "test_accuracy": 0.98},
        {"epoch": 2.0, "step": 118, "train_seconds": 1.5, "test_accuracy": 0.991},
        {"epoch": 3.0, "step": 177, "train_seconds": 2.0, "test_accuracy": 0.992},
    ]
    _run_folder(runs, "zero2_run", {**base, "distributed_type": "DEEPSPEED"}, rows, 30.0)
    _run_folder(runs, "ddp_run", {**base, "distributed_type": "MULTI_GPU", "zero_stage": 0}, rows[:2], 20.0)
    (runs / "bench" / "throughput-x.json").write_text(json.dumps({
        "benchmark": "throughput", "table_columns": ["label"], "date": "2026-11-30T00:00:00Z",
        "hardware_label": "2x H200", "command": "c", "label": "accel_mnist zero3_offload x2",
        "accelerate_config": "zero3_offload", "num_processes": 2, "samples_per_second": 500.0,
        "config": {"model": "cnn", "batch_size": 512, "epochs": 1},
    }))  # fmt: skip
    out = tmp_path / "out"
    assert session_summary.main([str(runs), "--out", str(out)]) == 0

    session = json.loads((out / "session.json").read_text())
    zero2, ddp = session["runs"]["zero2_run"], session["runs"]["ddp_run"]
    assert session["hardware"] == "2x NVIDIA H200"
    assert zero2["accelerate_config"] == "zero2" and ddp["accelerate_config"] == "multi_gpu"
    # (177 - 59) steps x 1024 samples over (2.0 - 1.0) s, from the first to the last epoch end
    assert zero2["steady_samples_per_second"] == pytest.approx(118 * 1024 / 1.0)
    assert "steady_samples_per_second" not in ddp  # one epoch end only
    assert zero2["first_99"] == {"step": 118, "train_seconds": 1.5, "test_accuracy": 0.991}
    assert zero2["command_wall_seconds"] == 30.0 and "output_dir" not in zero2["config"]
    assert (out / "throughput-x.json").exists() and "zero3_offload" in (out / "throughput.md").read_text()
    assert (out / "throughput.png").stat().st_size > 0


def test_memory_candidates_point_at_existing_configs():
    for name, (config, launch_args, _) in memory.LAUNCH.items():
        assert (REPO / "accelerate_configs" / f"{config}.yaml").is_file(), name
        if "--deepspeed_config_file" in launch_args:
            path = REPO / launch_args[launch_args.index("--deepspeed_config_file") + 1]
            assert json.loads(path.read_text())["zero_optimization"]["stage"] == int(name[4]), name


def test_memory_paper_formulas():
    psi, n = 1_000, 2
    assert [memory.paper_model_states(psi, n, s) for s in range(4)] == [16_000, 10_000, 9_000, 8_000]


# -- python -m benchmarks: the suites' bookkeeping ---------------------------------------------


@pytest.mark.parametrize("name", sorted(SUITES))
def test_suite_rows_are_complete_and_their_commands_fill(name, tmp_path):
    suite = SUITES[name]
    names = [row["name"] for row in suite["rows"]]
    assert len(names) == len(set(names))
    ctx = runner.context(tmp_path, "recipe.yaml")
    for row in suite["rows"]:
        assert {"name", "group", "what", "cmd", "parse"} <= set(row), row["name"]
        assert row["parse"] in runner.PARSERS, row["name"]
        for run in runner.runs_of(row):
            argv = runner.fill(row["cmd"], {**ctx, "run": str(tmp_path / "r"), "seed": run["seed"]})
            assert not [part for part in argv if re.search(r"\{[a-z_]+\}", part)], argv
        for part in row["cmd"]:
            if part.startswith("accelerate_configs/"):
                assert (REPO / part).is_file(), part
    for num, den, _ in suite.get("ratios", []):
        assert {num, den} <= set(names)
    for plotted in suite.get("plot") or []:
        assert plotted in names


def test_h200_suite_fits_one_ten_minute_call():
    assert sum(row["budget"] for row in SUITES["h200"]["rows"]) <= 570
    seeded = [row for row in SUITES["h200"]["rows"] if row["group"] == "time_to_99" and row["name"] == "recipe"]
    assert seeded and len(seeded[0]["seeds"]) == 5


def test_parse_curve_time_to_target_and_epoch_seconds(tmp_path):
    rows = [
        {"epoch": 0.5, "step": 10, "train_seconds": 0.4, "test_accuracy": 0.95},
        {"epoch": 1.0, "step": 20, "train_seconds": 1.0, "test_accuracy": 0.985},
        {"epoch": 1.5, "step": 30, "train_seconds": 1.5, "test_accuracy": 0.9905},
        {"epoch": 2.0, "step": 40, "train_seconds": 2.5, "test_accuracy": 0.991},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    parsed = runner.parse_curve("", tmp_path, {"target": 0.99})
    assert parsed["reached"] and parsed["seconds_to_target"] == 1.5 and parsed["step_at_target"] == 30
    assert parsed["best_test_accuracy"] == 0.991
    assert parsed["epoch_seconds"] == pytest.approx([1.0, 1.5])
    missing = runner.parse_curve("", tmp_path / "none", {"target": 0.99})
    assert not missing["reached"] and missing["curve"] == []


def test_readme_states_ratios_commands_and_skips(tmp_path):
    rows = SUITES["cpu"]["rows"]
    runs = [
        {"row": "floor", "index": i, "seed": i, "rc": 0, "wall_seconds": w, "loadavg_1m": 0.5, "command": "python -c x",
         "parsed": {}} for i, w in enumerate([4.0, 5.0])
    ] + [
        {"row": "one_step", "index": i, "seed": i, "rc": 0, "wall_seconds": w, "loadavg_1m": 0.7,
         "command": "accel-mnist train --model linear", "parsed": {}} for i, w in enumerate([6.0, 4.4])
    ]  # fmt: skip
    record = {"suite": "cpu", "date": "2026-12-01T08:00:00Z", "hardware_label": "CPU: test (2 cores, 2 threads)",
              "versions": {"torch": "x"}, "command": "python -m benchmarks cpu", "recipe": None, "rows": rows,
              "ratios": SUITES["cpu"]["ratios"], "runs": runs, "skipped": {"loader_overhead": "time budget spent"},
              "suite_seconds": 20.0}  # fmt: skip
    text = report.readme(record)
    assert "one_step / floor (median wall seconds): 5.20 / 4.50 = **1.16**" in text
    assert "one_step / floor (min wall seconds): 4.40 / 4.00 = **1.10**" in text
    assert "`accel-mnist train --model linear`" in text and "skipped loader_overhead: time budget spent" in text


def test_dry_run_prints_every_command_without_running(capsys, tmp_path):
    assert runner.main(["h200", "--dry-run", "--recipe", str(REPO / "pyproject.toml"), "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == sum(len(runner.runs_of(row)) for row in SUITES["h200"]["rows"])
    assert not list(tmp_path.iterdir())


def test_a_group_runs_alone(capsys, tmp_path):
    assert runner.main(["cpu", "--dry-run", "--group", "step", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    step_rows = [row for row in SUITES["cpu"]["rows"] if row["group"] == "step"]
    assert len(lines) == sum(len(runner.runs_of(row)) for row in step_rows)
    assert all("benchmarks.cpu_overhead" in line or "benchmarks.loader_overhead" in line for line in lines)
    assert runner.main(["cpu", "--dry-run", "--group", "stpe", "--out", str(tmp_path)]) == 2
    assert "error: --group stpe: not a group of cpu" in capsys.readouterr().err


def test_runner_refuses_a_missing_recipe(capsys, tmp_path):
    assert runner.main(["h200", "--recipe", str(tmp_path / "nope.yaml"), "--out", str(tmp_path)]) == 2
    assert "error: --recipe" in capsys.readouterr().err


def test_plain_pytorch_follows_a_recipe_and_flags_win(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model: mlp\nbatch_size: 512\nlr: 0.01\nscheduler: onecycle\neval_every: 10\nprewarm: true\n")
    args = plain_pytorch.parse_args(["--config", str(recipe), "--lr", "0.002"])
    assert (args.model, args.batch_size, args.lr, args.scheduler, args.eval_every) == (
        "mlp",
        512,
        0.002,
        "onecycle",
        10,
    )
    assert args.warmup and args.recipe_ignored == []


def test_plot_curves_draws_every_run_of_the_named_rows(tmp_path):
    def run(row, curve):
        return {"row": row, "rc": 0, "parsed": {"curve": curve}}

    record = {"hardware_label": "1x test GPU", "date": "2026-12-01T00:00:00Z",
              "runs": [run("recipe", [(0.1, 0.95, 10), (0.3, 0.991, 30)]), run("recipe_plain", [(0.2, 0.97, 10)]),
                       run("other", [(1.0, 0.9, 5)]), {"row": "recipe", "rc": 1}]}  # fmt: skip
    path = report.plot_curves(record, ["recipe", "recipe_plain"], tmp_path / "curves.png")
    assert path == tmp_path / "curves.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_curves(record, ["missing"], tmp_path / "none.png") is None
