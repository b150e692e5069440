"""The memory suites' bookkeeping: rows, what is read from a run, and the README's memory table."""

from __future__ import annotations

import json

from benchmarks import memory_suite, report, runner
from benchmarks.suites import SUITES

MIB = 1 << 20


def test_the_h200_memory_suite_fits_one_ten_minute_call_and_covers_the_clients_configs():
    rows = SUITES["memory_h200"]["rows"]
    assert sum(row["budget"] for row in rows) <= 570
    configs = {part for row in rows for part in row["cmd"] if part.startswith("accelerate_configs/")}
    wanted = ("single_gpu", "zero2", "zero3", "zero3_offload")
    assert {f"accelerate_configs/{name}.yaml" for name in wanted} <= configs
    assert any("recipes/zero3_offload_1b.yaml" in row["cmd"] for row in rows)


def test_the_cpu_memory_suite_runs_every_stage_on_one_and_two_processes_in_fp32():
    rows = {row["name"]: row for row in SUITES["memory_cpu"]["rows"]}
    for stage in ("ddp", "zero1", "zero2", "zero3"):
        for n in (1, 2):
            cmd = rows[f"{stage}_{n}"]["cmd"]
            assert cmd[cmd.index("--num_processes") + 1] == str(n) and "--mixed_precision" in cmd
    assert all(row["env"]["CUDA_VISIBLE_DEVICES"] == "" for row in rows.values())


def _process(rank, params, peak):
    return {"rank": rank, "parameter_bytes": params, "gradient_bytes": params, "optimizer_state_bytes": 2 * params,
            "offloaded_bytes": 0, "peak_allocated_bytes": None, "peak_rss_bytes": peak}  # fmt: skip


def test_a_run_is_read_from_its_results_and_tabled(tmp_path):
    memory = {"per_process": [_process(0, 4 * MIB, 900 * MIB), _process(1, 5 * MIB, 950 * MIB)],
              "predicted": {"parameter_bytes": 5 * MIB, "gradient_bytes": 5 * MIB, "optimizer_state_bytes": 10 * MIB,
                            "offloaded_bytes": 0}}  # fmt: skip
    results = {"distributed_type": "DEEPSPEED", "zero_stage": 2, "num_processes": 2, "mixed_precision": "no",
               "offload_optimizer": "none", "offload_param": "none", "memory": memory,
               "confusion_matrix": [[1]]}  # fmt: skip
    (tmp_path / "results.json").write_text(json.dumps(results))
    row = next(r for r in SUITES["memory_cpu"]["rows"] if r["name"] == "zero2_2")
    parsed = runner.PARSERS["memory"]("", tmp_path, row)
    assert parsed["memory"] == memory and "confusion_matrix" not in parsed
    assert runner.PARSERS["memory"]("", tmp_path / "missing", row) == {}
    assert memory_suite.largest(parsed)["rank"] == 1
    run = {"row": "zero2_2", "rc": 0, "parsed": parsed, "wall_seconds": 40.0, "loadavg_1m": 1.0, "command": "x"}
    record = {"rows": [row], "runs": [run]}
    [*_, line] = memory_suite.readme_section(record)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:4] == ["zero2_2", "DEEPSPEED ZeRO-2", "2", "no"]
    assert cells[4:9] == ["5.0 / 5.0", "5.0 / 5.0", "10.0 / 10.0", "0.0 / 0.0", "20.0 / 20.0"]
    assert cells[9:] == ["1.000", "950", "930"]  # the ratio, the peak, the peak above the model states
    assert report.key_numbers(row, [run]) == "model states 20.0 / 20.0 MiB (measured / predicted), peak 950 MiB"
