"""Every shipped recipe under every strategy that runs on one GPU, launched as a user types it
(`accelerate launch --config_file accelerate_configs/S.yaml --num_processes 1 -m accel_mnist train
--config recipes/R.yaml`, or `python -m accel_mnist train --config R --deepspeed_config J`), at the
precision the strategy's own config names. Each launch trains (exit 0, results.json with a test
accuracy well above chance) or refuses in one `error:` line (exit 2; through `accelerate launch`
the launcher's 1); a traceback from the package fails. The cells are tests/gpu_suite.py's, which
`make test-gpu` runs beside the rest of its quick suite; MATRIX_OUT, where set, receives each
launch's row as JSON (recipes_cuda.json)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.gpu_suite import recipe_cells, run_cells

pytestmark = pytest.mark.gpu


def test_every_recipe_under_every_gpu_strategy_trains_or_refuses_in_one_line(tmp_path):
    cells = recipe_cells(tmp_path)
    assert len({c.name.split()[1] for c in cells}) >= 3 and len(cells) >= 3 * 14, [c.name for c in cells]
    rows = run_cells(cells, tmp_path, parallel=8, budget=1800)
    if os.environ.get("MATRIX_OUT"):
        Path(os.environ["MATRIX_OUT"], "recipes_cuda.json").write_text(json.dumps(rows, indent=1))
    assert len(rows) == len(cells)
    wrong = [f"{row['cell']}: {row['detail']}" for row in rows if not row["passed"]]
    assert not wrong, "\n".join(wrong)
