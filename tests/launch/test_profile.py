"""`--profile N` under DeepSpeed ZeRO-2 on two CPU processes: each rank writes its trace, the
main process prints the table once, and training is unchanged around it."""

from __future__ import annotations

import json

import pytest

from tests.helpers import CONFIGS, accelerate_launch


@pytest.mark.slow
def test_each_rank_writes_its_trace_under_zero2(tmp_path, mnist_dir):
    launch = ["--config_file", str(CONFIGS / "zero2.yaml"), "--num_processes", "2", "--mixed_precision", "no",
              "--main_process_port", "0"]  # fmt: skip
    out = tmp_path / "run"
    proc, results = accelerate_launch(launch, ["--model", "linear", "--max-steps", "5", "--profile", "2",
                                               "--no-save-checkpoints"], out, timeout=300)  # fmt: skip
    assert proc.returncode == 0 and results is not None, proc.stderr[-3000:]
    assert results["distributed_type"] == "DEEPSPEED" and results["steps"] == 5
    found = results["profile"]
    assert found["steps"] == 2 and found["us_per_step"] > 0 and found["top"]
    for rank in (0, 1):
        trace = json.loads((out / "profile" / f"profile_{rank}.json").read_text())
        assert sum(e.get("name", "").startswith("ProfilerStep") for e in trace["traceEvents"]) == 2
    assert proc.stdout.count("profile: 2 steps") == 1  # the main process alone prints
