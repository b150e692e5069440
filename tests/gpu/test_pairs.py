"""The pair matrix's GPU cells (tests/pairs.py): every pair of option values meets in a cell
under every strategy that runs on a GPU, at each precision, one process (the lent machine has
one GPU). Eight launches at a time, as tests/gpu/test_matrix.py; MATRIX_OUT, where set,
receives each cell's outcome and the mismatches as JSON (pairs_cuda.json)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.matrix_worker import check_groups
from tests.pairs import groups


def test_every_gpu_pair_cell_trains_changes_with_a_line_or_refuses_in_one(tmp_path):
    record = Path(os.environ["MATRIX_OUT"], "pairs_cuda.json") if os.environ.get("MATRIX_OUT") else None
    # dynamo's groups compile each cell's model: started first, they end with the others.
    ordered = sorted(groups("cuda"), key=lambda group: not group[0].dynamo)
    _seen, wrong = check_groups(ordered, "cuda", tmp_path, parallel=8, record=record, table="pairs", timeout=1800)
    if any("expected crashes" in line for line in wrong):
        wrong.append("a KNOWN_FAILURES pair of tests/pairs.py that no longer fails so: remove its entry")
    assert not wrong, "\n".join(wrong)
