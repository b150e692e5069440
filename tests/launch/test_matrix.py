"""The option matrix's CPU cells (tests/matrix.py `groups("cpu")`): one launch per
strategy, precision and process count, every option a cell inside it, each compared with what the
rules the runtime applies say it does. Synthetic data, two steps a cell.

The groups the pair matrix runs on the CPU (tests/pairs.py CPU_GROUPS, tests/launch/test_pairs.py)
are left to it: there every option value meets every other one in a cell checked by the same rules,
so each single option's outcome is seen there too (a value that refuses alone refuses in each of its
cells, and a changed one prints its line in each). Run once more here they took 227 s of the CPU
suite (benchmarks/results/cpu-2026-12-06-ci)."""

from __future__ import annotations

import pytest

from tests.matrix import groups
from tests.matrix_worker import check_groups
from tests.pairs import CPU_GROUPS

GROUPS = [group for group in groups("cpu") if (group[0].name, group[1], group[2]) not in CPU_GROUPS]


@pytest.mark.slow
@pytest.mark.parametrize("group", GROUPS, ids=[f"{s.name}-{p}-{n}p".replace(" ", "_") for s, p, n in GROUPS])
def test_each_cell_trains_changes_with_a_line_or_refuses_in_one(group, tmp_path):
    _seen, wrong = check_groups([group], "cpu", tmp_path)
    assert not wrong, "\n".join(wrong)


SECOND_JSON = """
import json, sys
from accel_mnist import TrainConfig, train
from accel_mnist.errors import UsageError
from tests.matrix_worker import small_mnist
from pathlib import Path
root = Path(sys.argv[1])
base = dict(max_steps=2, batch_size=32, quiet=True, plots=False, export=False, save_checkpoints=False,
            download=False, data_dir=small_mnist(root / "mnist"))
first = json.load(open("accelerate_configs/deepspeed_config.json"))
other = dict(first, zero_optimization=dict(first["zero_optimization"], stage=1))
(root / "other.json").write_text(json.dumps(other))
runs = [("accelerate_configs/deepspeed_config.json", "a"), ("accelerate_configs/deepspeed_config.json", "b"),
        (str(root / "other.json"), "c")]
for path, name in runs:
    try:
        print(name, train(TrainConfig(**base, deepspeed_config=path, output_dir=str(root / name)))["steps"])
    except UsageError as e:
        print(name, "error:", e)
"""


@pytest.mark.slow
def test_a_second_run_in_one_process_reuses_its_json_and_refuses_another(tmp_path):
    import subprocess
    import sys

    from tests.helpers import REPO

    proc = subprocess.run([sys.executable, "-c", SECOND_JSON, str(tmp_path)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line[:2] in ("a ", "b ", "c ")]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lines[:2] == ["a 2", "b 2"], proc.stdout[-2000:]
    assert lines[2].startswith('c error: deepspeed_config="') and "start a fresh process" in lines[2]
