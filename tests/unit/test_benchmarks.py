"""The benchmark tools that run without a GPU: their bookkeeping, not their timings."""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import pytest

from benchmarks import report, runner
from benchmarks.baselines import plain_pytorch
from benchmarks.suites import SUITES
from tests.helpers import REPO


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
    for num, den, *_ in suite.get("ratios", []):
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
              "ratios": SUITES["cpu"]["ratios"], "runs": runs, "skipped": {"late_row": "time budget spent"},
              "suite_seconds": 20.0}  # fmt: skip
    text = report.readme(record)
    assert "one_step / floor (median wall seconds): 5.20 / 4.50 = **1.16**" in text
    assert "one_step / floor (min wall seconds): 4.40 / 4.00 = **1.10**" in text
    assert "`accel-mnist train --model linear`" in text and "skipped late_row: time budget spent" in text


def test_dry_run_prints_every_command_without_running(capsys, tmp_path):
    assert runner.main(["h200", "--dry-run", "--recipe", str(REPO / "pyproject.toml"), "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == sum(len(runner.runs_of(row)) for row in SUITES["h200"]["rows"])
    assert not list(tmp_path.iterdir())


def test_a_group_runs_alone(capsys, tmp_path):
    assert runner.main(["h200", "--dry-run", "--group", "startup", "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    startup_rows = [row for row in SUITES["h200"]["rows"] if row["group"] == "startup"]
    assert len(lines) == sum(len(runner.runs_of(row)) for row in startup_rows)
    assert all(" -c " in line or "--max-steps 1 " in line for line in lines)  # the floor and the 1-step commands
    assert runner.main(["h200", "--dry-run", "--group", "stratup", "--out", str(tmp_path)]) == 2
    assert "error: --group stratup: not a group of h200" in capsys.readouterr().err


def test_a_row_runs_alone(capsys, tmp_path):
    twin = next(row for row in SUITES["h200_speed"]["rows"] if row["name"] == "recipe_graph_plain")
    argv = ["h200_speed", "--dry-run", "--row", "recipe_graph_plain", "--recipe", "recipes/fast99.yaml"]
    assert runner.main([*argv, "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(runner.runs_of(twin)) and all("baselines.plain_pytorch" in line for line in lines)
    assert runner.main(["h200_speed", "--dry-run", "--row", "recipe_grpah", "--out", str(tmp_path)]) == 2
    assert "error: --row recipe_grpah: not a row of h200_speed" in capsys.readouterr().err


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


def test_the_plain_twin_trains_and_writes_its_curve_and_record(tmp_path, mnist_dir):
    # What the suites read of the twin: metrics.jsonl (the curve rows), and its record in --out.
    import os
    import subprocess
    import sys

    args = ["-m", "benchmarks.baselines.plain_pytorch", "--model", "linear", "--batch-size", "64", "--max-steps", "3",
            "--warmup", "--data-dir", str(mnist_dir), "--metrics-out", str(tmp_path / "metrics.jsonl"),
            "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 3 and row["epoch_end"] and 0 < row["test_accuracy"] <= 1 and row["train_seconds"] > 0
    [saved] = tmp_path.glob("plain_pytorch-*.json")
    record = json.loads(saved.read_text())
    assert record["benchmark"] == "plain_pytorch" and record["steps"] == 3 and record["device"] == "cpu"


def test_plot_curves_draws_every_run_of_the_named_rows(tmp_path):
    def run(row, curve):
        return {"row": row, "rc": 0, "parsed": {"curve": curve}}

    record = {"hardware_label": "1x test GPU", "date": "2026-12-01T00:00:00Z",
              "runs": [run("recipe", [(0.1, 0.95, 10), (0.3, 0.991, 30)]), run("recipe_plain", [(0.2, 0.97, 10)]),
                       run("other", [(1.0, 0.9, 5)]), {"row": "recipe", "rc": 1}]}  # fmt: skip
    path = report.plot_curves(record, ["recipe", "recipe_plain"], tmp_path / "curves.png")
    assert path == tmp_path / "curves.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_curves(record, ["missing"], tmp_path / "none.png") is None


def test_run_once_keeps_the_records_a_command_saved_in_its_folder(tmp_path):
    script = ("import json, sys; from pathlib import Path; run = Path(sys.argv[1]); "
              "(run / 'plain_pytorch-1-linear.json').write_text(json.dumps({'benchmark': 'plain_pytorch', 'x': 1})); "
              "(run / 'results.json').write_text(json.dumps({'test_accuracy': 0.5})); "
              "print(json.dumps({'ratio': 1.5}))")  # fmt: skip
    row = {"name": "saver", "group": "g", "what": "w", "cmd": ["{python}", "-c", script, "{run}"], "parse": "json_line"}
    record = runner.run_once(row, {"index": 0, "seed": 0}, runner.context(tmp_path, None), tmp_path, timeout=120)
    assert record["parsed"] == {"ratio": 1.5}
    assert record["records"] == [{"benchmark": "plain_pytorch", "x": 1}]  # results.json is no record
    assert not (tmp_path / "runs" / "saver-0").exists()


def test_save_record_writes_only_where_asked(tmp_path):
    from benchmarks import benchlib

    hw = {"cpu": "test", "cpu_cores": 2, "torch_threads": 2, "gpu": None, "gpu_count": 0}
    record = {"hardware": hw, "versions": {}, "date": "2026-12-01T00:00:00Z", "command": "c"}
    assert benchlib.save_record("bench", "t", dict(record), None) is None
    path = benchlib.save_record("bench", "a b", dict(record), tmp_path)
    assert path == tmp_path / "bench-20261201T000000Z-a_b.json" and json.loads(path.read_text())["benchmark"] == "bench"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # the record only: no markdown table


# -- python -m benchmarks.readme: benchmarks/README.md's tables from the results -----------------


def test_benchmarks_readme_is_generated_from_the_newest_results():
    from benchmarks import readme

    text = readme.README.read_text()
    assert readme.rewrite(text) == text, "benchmarks/README.md is stale: run python -m benchmarks.readme"


# A row the cpu suite ran until 2026-12-05: its group's table still comes from the results that have it.
EARLIER_ROW = {"name": "loader_overhead", "group": "step", "what": "per-batch cost", "parse": "json_line",
               "cmd": ["{python}", "-m", "benchmarks.loader_overhead"], "repeat": 1}  # fmt: skip


def _suite_json(folder: Path, date: str, walls: dict[str, list[float]], parsed: dict | None = None) -> None:
    rows = [row for row in [*SUITES["cpu"]["rows"], EARLIER_ROW] if row["name"] in walls]
    runs = [{"row": name, "index": i, "seed": i, "rc": 0, "wall_seconds": w, "loadavg_1m": 0.5, "command": name,
             "parsed": parsed or {}} for name, ws in walls.items() for i, w in enumerate(ws)]  # fmt: skip
    record = {"suite": "cpu", "date": date, "hardware_label": "CPU: test", "command": f"cpu {date}", "rows": rows,
              "ratios": SUITES["cpu"]["ratios"], "runs": runs}  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "suite.json").write_text(json.dumps(record))


def test_readme_takes_each_group_from_its_newest_folder_and_notices_a_stale_region(tmp_path):
    from benchmarks import readme

    results = tmp_path / "results"
    loader = {"device_loader_us_per_batch": 24.0, "prepared_us_per_batch": 48.0, "extra_us_per_batch": 24.0}
    _suite_json(results / "cpu-a-2026-12-01", "2026-12-01T08:00:00Z",
                {"floor": [4.0, 5.0], "one_step": [6.0, 4.4], "loader_overhead": [3.0]}, loader)  # fmt: skip
    _suite_json(results / "cpu-b-2026-12-02", "2026-12-02T08:00:00Z", {"loader_overhead": [3.5]},
                {**loader, "extra_us_per_batch": 20.0})  # fmt: skip
    (results / "old-2026-11-30").mkdir()
    (results / "old-2026-11-30" / "cpu_overhead-x-linear.json").write_text("{}")

    text = readme.generate(results)

    def section(heading: str) -> str:
        start = text.index(heading)
        return text[start : text.index("\n###", start)]

    startup, step = section("#### `cpu` startup"), section("#### `cpu` step")
    assert "cpu-a-2026-12-01" in startup and "one_step / floor (median wall seconds): 5.20 / 4.50 = **1.16**" in startup
    assert "cpu-b-2026-12-02" in step and "extra 20" in step and "cpu-a" not in step  # the newer run of the group
    assert "| [`old-2026-11-30`](results/old-2026-11-30/) | earlier format (cpu_overhead records)" in text
    assert text.index("cpu-b-2026-12-02`](") < text.index("cpu-a-2026-12-01`](", text.index("### Results folders"))

    page = tmp_path / "README.md"
    page.write_text(f"# b\n\n{readme.BEGIN}\nold table\n{readme.END}\n\nafter\n")
    args = ["--readme", str(page), "--results", str(results)]
    assert readme.main([*args, "--check"]) == 1 and "old table" in page.read_text()  # stale: --check fails
    assert readme.main(args) == 0 and readme.main([*args, "--check"]) == 0
    assert page.read_text().endswith(f"{readme.END}\n\nafter\n") and "old table" not in page.read_text()
    page.write_text("# no markers\n")
    with pytest.raises(ValueError):
        readme.main(args)


def test_a_step_profile_row_shows_each_variant():
    variant = {"step": "cuda_graph", "channels_last": True, "ms_per_step": 1.3659, "gpu_ms_per_step": 1.3306,
               "launch_calls_per_step": 2.0, "kernels_per_step": 104.0}  # fmt: skip
    runs = [{"rc": 0, "parsed": {"batch_size": 512, "variants": [variant, {**variant, "channels_last": False}]}}]
    text = report.key_numbers({"name": "step_profile", "parse": "json_line"}, runs)
    assert text == ("batch_size 512; cuda_graph channels-last 1.37 ms/step (GPU 1.33, 2 launches); "
                    "cuda_graph NCHW 1.37 ms/step (GPU 1.33, 2 launches)")  # fmt: skip


def test_a_run_shows_its_ms_per_step_past_the_first_step():
    """Beside a benchmark that leaves its warm-up untimed, a run's steps past its first count."""
    runs = [{"rc": 0, "parsed": {"steps": 11, "train_seconds": 1.5, "warmup_seconds": 0.5}},
            {"rc": 0, "parsed": {"steps": 11, "train_seconds": 1.3, "warmup_seconds": 0.5}},
            {"rc": 1, "parsed": {"steps": 11, "train_seconds": 9.0, "warmup_seconds": 0.0}}]  # fmt: skip
    assert report.steady_ms_per_step(runs[0]["parsed"]) == pytest.approx(100.0)
    assert report.steady_ms_per_step({"steps": 1, "train_seconds": 0.5, "warmup_seconds": 0.5}) is None
    text = report.key_numbers({"name": "r", "parse": "results"}, runs)
    assert text == "train s 1.4 (1.3–1.5); ms/step past the first 90 (80–100)"


def test_a_repeated_json_line_row_shows_each_numbers_median_and_range():
    runs = [{"rc": 0, "parsed": {"ms": v}} for v in (1.0, 3.0, 2.0)]
    assert report.key_numbers({"name": "r", "parse": "json_line"}, runs) == "ms 2 (1–3)"
    assert report.key_numbers({"name": "r", "parse": "json_line"}, runs[:1]) == "ms 1"


def test_a_pairs_ratio_pairs_runs_by_their_repeat_index():
    def run(row, index, rc=0, **parsed):
        return {"row": row, "index": index, "rc": rc, "wall_seconds": 1.0, "parsed": parsed}

    steady = {"steps": 11, "warmup_seconds": 0.5}
    runs = [run("a", 0, train_seconds=1.5, **steady), run("b", 0, ms=50.0),
            run("a", 1, train_seconds=1.7, **steady), run("b", 1, rc=1, ms=1.0),  # a failed run: no pair
            run("a", 2, train_seconds=1.3, **steady), run("b", 2, ms=100.0)]  # fmt: skip
    record = {"ratios": [("a", "b", "pairs", "steady_ms", "ms"), ("a", "b", "median")], "runs": runs}
    assert report.ratio_lines(record) == [
        "* a / b (steady_ms / ms, run by run): median **1.400** (0.800–2.000) over 2 pairs",
        "* a / b (median wall seconds): 1.00 / 1.00 = **1.00**",
    ]


def test_a_call_of_one_row_takes_over_that_row_only(tmp_path):
    from benchmarks import readme

    results = tmp_path / "results"
    _suite_json(results / "cpu-a-2026-12-01", "2026-12-01T08:00:00Z", {"floor": [4.0], "one_step": [6.0]})
    _suite_json(results / "cpu-c-2026-12-03", "2026-12-03T08:00:00Z", {"one_step": [7.5]})  # as --row one_step
    text = readme.generate(results)
    start = text.index("#### `cpu` startup")
    startup = text[start : text.index("\n###", start + 1)]
    assert startup.index("cpu-c-2026-12-03") < startup.index("cpu-a-2026-12-01")  # both, the newest first
    assert (
        "| floor (cpu-a-2026-12-01) | 1/1 | 4 |" in startup and "| one_step (cpu-c-2026-12-03) | 1/1 | 7.5 |" in startup
    )
    assert "one_step / floor" not in startup  # a ratio only within one call


def test_a_scaling_ratio_states_the_share_of_linear():
    rows = [{"name": "d1", "processes": 1}, {"name": "d2", "processes": 2}, {"name": "d4", "processes": 4}]
    runs = [{"row": row, "index": i, "rc": 0, "wall_seconds": 1.0, "parsed": {"rate": rate}}
            for row, i, rate in (("d1", 0, 100.0), ("d1", 1, 120.0), ("d2", 0, 200.0), ("d2", 1, 196.0),
                                 ("d4", 0, 330.0))]  # fmt: skip
    key = ("rate", "rate")
    record = {"rows": rows, "runs": runs, "ratios": [("d2", "d1", "scaling", *key), ("d4", "d1", "scaling", *key)]}
    assert report.ratio_lines(record) == [
        "* d2 / d1 (median rate / rate): 198 / 110 = **1.80x** on 2x the processes: **90%** of linear",
        "* d4 / d1 (median rate / rate): 330 / 110 = **3.00x** on 4x the processes: **75%** of linear",
    ]


def test_scaling_suites_compare_each_count_with_one_process_of_its_group():
    for name, counts in (("scaling_h200", {1, 2, 4, 8}), ("scaling_cpu", {1, 2})):
        suite = SUITES[name]
        groups: dict[str, set[int]] = {}
        for row in suite["rows"]:
            groups.setdefault(row["group"], set()).add(row["processes"])
            assert row["cmd"][row["cmd"].index("--num_processes") + 1] == str(row["processes"])
        assert len(groups) == 4 and all(found == counts for found in groups.values()), groups
        assert len(suite["ratios"]) == 4 * (len(counts) - 1)
        by_name = {row["name"]: row for row in suite["rows"]}
        for num, den, stat, *_ in suite["ratios"]:
            assert stat == "scaling" and by_name[den]["processes"] == 1
            assert by_name[num]["group"] == by_name[den]["group"]


def test_a_row_of_n_gpus_is_skipped_on_a_machine_of_fewer(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    suite = {"needs": "cuda"}
    assert runner.skip_reason({"needs": "cuda2"}, suite, None) is None
    assert runner.skip_reason({"needs": "cuda4"}, suite, None) == "needs 4 CUDA GPUs"
    assert runner.skip_reason({}, suite, None) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runner.skip_reason({"needs": "cuda2"}, {}, None) == "needs a CUDA GPU"


def test_command_stacks_finds_the_function_a_command_waits_in(tmp_path, monkeypatch):
    from benchmarks import command_stacks

    (tmp_path / "sleeper.py").write_text(
        "import sys, time\n\ndef wait_here():\n    time.sleep(0.4)\n\nwait_here()\nsys.exit(3)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("sys.argv", list(sys.argv))  # main() sets the module's own
    out = tmp_path / "stacks.txt"
    assert command_stacks.main(["--interval", "0.01", "--out", str(out), "--", "sleeper"]) == 3
    waited = sum(
        float(line.rsplit(" ", 1)[1]) for line in out.read_text().splitlines() if "sleeper.py:wait_here" in line
    )
    assert 0.3 < waited < 1.0
    table = command_stacks.phases(command_stacks.read_stacks(out), ["sleeper.py:wait_here"])
    assert sum(table["sleeper.py:wait_here"].values()) == pytest.approx(waited)
    zipped = tmp_path / "stacks.txt.gz"
    zipped.write_bytes(gzip.compress(out.read_bytes()))
    assert command_stacks.read_stacks(zipped) == command_stacks.read_stacks(out)


def test_first_launches_times_the_prewarms_operations(tmp_path, capsys):
    from benchmarks import first_launches

    config = tmp_path / "tiny.yaml"
    config.write_text("model: linear\nbatch_size: 64\neval_batch_size: 100\nprewarm: true\n")
    # A --top above the number of distinct operations lists them all: which ones rank first is timing, and
    # a CI machine ranks them differently from this one.
    assert first_launches.main(["--config", str(config), "--top", "1000"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [json.loads(line) for line in lines[1:3]]
    assert [row["prewarm"] for row in rows] == ["first", "second"]
    assert rows[0]["ops"] == rows[1]["ops"] > 0  # the same operations, cold and warm
    table = [line.split() for line in lines[3:]]
    names = [name for _, _, name in table]
    assert len(set(names)) == len(names) <= rows[0]["ops"]
    assert "aten.addmm.default" in names  # the linear model's forward
    milliseconds = [float(ms) for ms, _, _ in table]
    assert milliseconds == sorted(milliseconds, reverse=True)


def test_the_width_variants_are_bncnn_at_other_widths():
    from benchmarks import variants

    convs = [m.out_channels for m in variants.bncnn_16().modules() if hasattr(m, "out_channels")]
    assert convs == [16, 32, 64]
    assert [m.out_channels for m in variants.bncnn_48().modules() if hasattr(m, "out_channels")] == [48, 96, 192]
