"""The option matrix's GPU cells (tests/matrix.py): every strategy that runs on a
GPU, at each precision, one process (the lent machine has one GPU), every option a cell. The
groups run eight launches at a time (the models are small); MATRIX_OUT, where set, receives
each cell's outcome and the mismatches as JSON."""

from __future__ import annotations

import os
from pathlib import Path

from tests.matrix import groups
from tests.matrix_worker import check_groups


def test_every_gpu_cell_trains_changes_with_a_line_or_refuses_in_one(tmp_path):
    record = Path(os.environ["MATRIX_OUT"], "matrix_cuda.json") if os.environ.get("MATRIX_OUT") else None
    # dynamo's groups compile each cell's model: started first, they end with the others.
    ordered = sorted(groups("cuda"), key=lambda group: not group[0].dynamo)
    _seen, wrong = check_groups(ordered, "cuda", tmp_path, parallel=8, record=record)
    assert not wrong, "\n".join(wrong)
